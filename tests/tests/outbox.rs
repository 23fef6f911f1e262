//! The transactional outbox and inbox (statement 27 of `docs/statements.md`), on PostgreSQL
//! and SQLite, against acemq-memory and RabbitMQ (TCP and TLS): a message
//! exists if and only if its transaction committed, even across the death
//! of the process that enqueued it; relays publish each row once (at least
//! once, with the same message-id, when one dies between a confirm and its
//! mark); a refused row stays with its error until it can go; the inbox
//! dedupes in the handler's transaction.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_core::outbox::{Begin, Inbox, Outbox};
use acemq_core::{Config, Conn, Envelope, Topology};
use acemq_tests::db::{self, Place, TestDb};
use acemq_tests::{brokers, deadline, depth, step, unique, Broker};
use sqlx::{Pool, Postgres, Sqlite};
use tokio::time::Instant;

/// A `Conn` whose sends give up within a second, so that a relay's lease
/// (several seconds in these tests) always has room for a publish.
async fn conn(b: &Broker) -> Conn {
    b.conn_with(Config::default().with_publish_timeout(Duration::from_secs(1)))
        .await
}

/// A migrated outbox on `pool`, a [`conn`] to `b` and a fresh queue on it.
async fn set_up<DB: TestDb>(b: &Broker, pool: &Pool<DB>) -> (Outbox<DB>, Conn, String) {
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let conn = conn(b).await;
    let q = queue(&conn).await;
    (outbox, conn, q)
}

/// A fresh queue on `conn`.
async fn queue(conn: &Conn) -> String {
    let q = unique("outbox");
    Topology::new().queue(&q).declare(conn).await.unwrap();
    q
}

/// Takes every message in `q` until it holds `n`, within 20 s: their ids
/// and redelivered flags, in order.
async fn take(conn: &Conn, q: &str, n: usize) -> Vec<String> {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut ids = Vec::new();
    while ids.len() < n {
        match ch.basic_get(q, true).await.unwrap() {
            Some(m) => ids.push(
                m.properties
                    .as_ref()
                    .ok()
                    .and_then(|p| p.message_id.as_ref())
                    .map(|id| id.to_string())
                    .unwrap_or_default(),
            ),
            None => {
                assert!(Instant::now() < until, "{q}: {} of {n} messages arrived", ids.len());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    ids
}

/// Waits (at most 30 s) until the outbox has no row waiting.
async fn drained<DB: TestDb>(outbox: &Outbox<DB>) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = outbox.waiting().await.unwrap();
        if waiting == 0 {
            return;
        }
        assert!(Instant::now() < until, "{} rows still wait in the outbox", waiting);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The database's name, for messages.
fn name<DB: TestDb>() -> &'static str {
    <DB as sqlx::Database>::NAME
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Runs `scenario` on PostgreSQL (when there) and SQLite, each with every broker.
macro_rules! on_databases_and_brokers {
    ($scenario:ident) => {
        deadline(async {
            for b in brokers().await {
                if let Some((place, pool)) = db::postgres().await {
                    step(
                        format!("{} on PostgreSQL", stringify!($scenario)),
                        $scenario::<Postgres>(&b, place, pool),
                    )
                    .await;
                }
                let (place, pool) = db::sqlite().await;
                step(
                    format!("{} on SQLite", stringify!($scenario)),
                    $scenario::<Sqlite>(&b, place, pool),
                )
                .await;
            }
        })
        .await
    };
}

// ---------------------------------------------------------------- atomicity

async fn rolled_back_is_never_published<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    let (outbox, conn, q) = set_up(b, &pool).await;
    let publisher = conn.publisher::<u32>("", &q);

    let mut tx = pool.begin().await.unwrap();
    let rolled_back = outbox.enqueue(&mut tx, &publisher, Envelope::new(), &1).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let committed = outbox.enqueue(&mut tx, &publisher, Envelope::new(), &2).await.unwrap();
    tx.commit().await.unwrap();

    let relay = outbox.relay(&conn).poll_interval(Duration::from_millis(10)).start();
    let ids = take(&conn, &q, 1).await;
    drained(&outbox).await;
    relay.stop().await;
    assert_eq!(
        ids,
        std::slice::from_ref(&committed),
        "{:?}/{}: only the committed message",
        b.kind,
        name::<DB>()
    );
    let ch = conn.consuming_connection().channel().await.unwrap();
    assert_eq!(
        depth(&ch, &q).await,
        0,
        "{:?}/{}: {rolled_back} was published",
        b.kind,
        name::<DB>()
    );
    let rows = DB::strings(&pool, "SELECT message_id FROM acemq_outbox").await;
    assert_eq!(
        rows,
        [[Some(committed)]],
        "{:?}/{}: the rolled-back row is not in the table",
        b.kind,
        name::<DB>()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_a_message_enqueued_in_a_rolled_back_transaction_is_never_published() {
    on_databases_and_brokers!(rolled_back_is_never_published);
}

/// The child process of the crash scenario: enqueues one message for queue
/// `ACEMQ_OUTBOX_QUEUE` in the database at `ACEMQ_OUTBOX_CHILD`, commits,
/// says so on stdout, and waits to be killed (no relay ever runs in it).
async fn child(place: &str, q: &str) {
    let place = match place.split_once('|') {
        Some(("sqlite", path)) => Place::Sqlite(path.into()),
        Some(("postgres", rest)) => {
            let (url, schema) = rest.rsplit_once('|').expect("postgres|url|schema");
            Place::Postgres {
                url: url.into(),
                schema: schema.into(),
            }
        }
        _ => panic!("ACEMQ_OUTBOX_CHILD={place}"),
    };
    // Only for the publisher's settings: nothing is published from here.
    let conn = Conn::open(&format!("memory://{}", unique("child")), Config::default())
        .await
        .unwrap();
    let publisher = conn.publisher::<u32>("", q);
    let id = match &place {
        Place::Sqlite(_) => {
            let pool = place.sqlite().await;
            let mut tx = pool.begin().await.unwrap();
            let id = Outbox::new(pool.clone())
                .enqueue(&mut tx, &publisher, Envelope::new(), &7)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            id
        }
        Place::Postgres { .. } => {
            let pool = place.postgres().await;
            let mut tx = pool.begin().await.unwrap();
            let id = Outbox::new(pool.clone())
                .enqueue(&mut tx, &publisher, Envelope::new(), &7)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            id
        }
    };
    // On a line of its own: libtest has written "test … ... " without a newline.
    println!("\noutbox-child committed {id}");
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("the child was not killed");
}

const CRASH_TEST: &str = "statement_27_a_committed_message_is_published_after_the_process_that_enqueued_it_died";

async fn survives_the_death_of_its_process<DB: TestDb>(b: &Broker, place: Place, pool: Pool<DB>) {
    let (outbox, conn, q) = set_up(b, &pool).await;
    let spec = match &place {
        Place::Sqlite(path) => format!("sqlite|{}", path.display()),
        Place::Postgres { url, schema } => format!("postgres|{url}|{schema}"),
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([CRASH_TEST, "--exact", "--nocapture", "--test-threads", "1"])
        .env("ACEMQ_OUTBOX_CHILD", spec)
        .env("ACEMQ_OUTBOX_QUEUE", &q)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let id = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| line.strip_prefix("outbox-child committed ").map(str::to_owned))
    });
    let id = tokio::time::timeout(Duration::from_secs(60), id)
        .await
        .expect("the child commits within 60 s")
        .unwrap()
        .expect("the child says what it committed");
    // Killed between its commit and any publish.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed");
    let ch = conn.consuming_connection().channel().await.unwrap();
    assert_eq!(depth(&ch, &q).await, 0, "nothing was published before a relay ran");

    let relay = outbox.relay(&conn).poll_interval(Duration::from_millis(10)).start();
    let ids = take(&conn, &q, 1).await;
    drained(&outbox).await;
    relay.stop().await;
    assert_eq!(
        ids,
        [id],
        "{:?}/{}: the committed message, under its id",
        b.kind,
        name::<DB>()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_a_committed_message_is_published_after_the_process_that_enqueued_it_died() {
    if let (Ok(place), Ok(q)) = (std::env::var("ACEMQ_OUTBOX_CHILD"), std::env::var("ACEMQ_OUTBOX_QUEUE")) {
        return deadline(child(&place, &q)).await;
    }
    on_databases_and_brokers!(survives_the_death_of_its_process);
}

// -------------------------------------------------------------- concurrency

async fn enqueue_many<DB: TestDb>(outbox: &Outbox<DB>, pool: &Pool<DB>, conn: &Conn, q: &str, n: u32) -> Vec<String> {
    let publisher = conn.publisher::<u32>("", q);
    let mut tx = pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(outbox.enqueue(&mut tx, &publisher, Envelope::new(), &i).await.unwrap());
    }
    tx.commit().await.unwrap();
    ids
}

/// Two relays on one table, each with its own pool (as two processes).
async fn two_relays_publish_each_row_once<DB: TestDb>(b: &Broker, place: Place, pool: Pool<DB>) {
    let (outbox, conn, q) = set_up(b, &pool).await;
    let ids = enqueue_many(&outbox, &pool, &conn, &q, 1000).await;

    let second: Outbox<DB> = Outbox::new(reopen::<DB>(&place).await);
    let one = outbox
        .relay(&conn)
        .name("one")
        .batch(50)
        .lease(Duration::from_secs(10))
        .start();
    let two = second
        .relay(&conn)
        .name("two")
        .batch(50)
        .lease(Duration::from_secs(10))
        .start();
    drained(&outbox).await;
    one.stop().await;
    two.stop().await;

    let got = take(&conn, &q, ids.len()).await;
    let ch = conn.consuming_connection().channel().await.unwrap();
    assert_eq!(
        depth(&ch, &q).await,
        0,
        "{:?}/{}: no row was published twice",
        b.kind,
        name::<DB>()
    );
    let mut counts: HashMap<&str, u32> = HashMap::new();
    for id in &got {
        *counts.entry(id).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{:?}/{}: published twice: {twice:?}",
        b.kind,
        name::<DB>()
    );
    assert_eq!(
        got.iter().collect::<HashSet<_>>(),
        ids.iter().collect::<HashSet<_>>(),
        "{:?}/{}: every row, under its id",
        b.kind,
        name::<DB>()
    );
    conn.close().await.unwrap();
}

/// A second pool on the same database (as another process would have).
async fn reopen<DB: TestDb>(place: &Place) -> Pool<DB> {
    let any: Box<dyn std::any::Any> = match place {
        Place::Postgres { .. } => Box::new(place.postgres().await),
        Place::Sqlite(_) => Box::new(place.sqlite().await),
    };
    *any.downcast::<Pool<DB>>().expect("the place is of this database")
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_two_relays_on_one_table_publish_every_row_exactly_once() {
    on_databases_and_brokers!(two_relays_publish_each_row_once);
}

/// A relay dies (its task aborted, its database connections closed) after
/// the broker has some of its batch and before it marks any of it: the next
/// relay publishes those rows again, under the same message-ids.
async fn dead_relay_means_at_least_once<DB: TestDb>(b: &Broker, place: Place, pool: Pool<DB>) {
    let (outbox, conn, q) = set_up(b, &pool).await;
    let ids = enqueue_many(&outbox, &pool, &conn, &q, 3000).await;

    let doomed_pool = reopen::<DB>(&place).await;
    let lease = Duration::from_secs(3);
    let doomed = Outbox::new(doomed_pool.clone())
        .relay(&conn)
        .name("doomed")
        .batch(3000)
        .lease(lease)
        .start();
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while depth(&ch, &q).await == 0 {
        assert!(Instant::now() < until, "the doomed relay published nothing");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(doomed);
    doomed_pool.close().await;
    let marked = DB::strings(
        &pool,
        "SELECT CAST(COUNT(*) AS TEXT) FROM acemq_outbox WHERE dispatched_at IS NOT NULL",
    )
    .await;
    assert_eq!(
        marked,
        [[Some("0".to_owned())]],
        "{:?}/{}: the relay died before its marks",
        b.kind,
        name::<DB>()
    );
    // Let the publishes it had written arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = depth(&ch, &q).await as usize;
    assert!(before >= 1);

    // SQLite: the rows are free once the dead relay's lease is over.
    let relay = outbox.relay(&conn).name("next").batch(500).start();
    drained(&outbox).await;
    relay.stop().await;
    let got = take(&conn, &q, ids.len() + before).await;
    assert_eq!(depth(&ch, &q).await, 0);
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for id in &got {
        *counts.entry(id).or_default() += 1;
    }
    let all: HashSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        counts.keys().copied().collect::<HashSet<_>>(),
        all,
        "{:?}/{}: every row, under its id",
        b.kind,
        name::<DB>()
    );
    let duplicated = counts.values().filter(|n| **n == 2).count();
    assert_eq!(
        duplicated,
        before,
        "{:?}/{}: what the dead relay published comes again, once, with the same id",
        b.kind,
        name::<DB>()
    );
    println!(
        "{:?}/{}: {before} of {} rows published again after the relay died",
        b.kind,
        name::<DB>(),
        ids.len()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_a_relay_that_dies_between_confirm_and_mark_means_at_least_once_with_the_same_id() {
    on_databases_and_brokers!(dead_relay_means_at_least_once);
}

// ------------------------------------------------------------- refused rows

async fn refused_row_waits_for_its_binding<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let conn = conn(b).await;
    let q = unique("outbox.late");
    let x = unique("outbox.x");
    Topology::new().exchange(&x, "direct").declare(&conn).await.unwrap();
    let publisher = conn.publisher::<u32>(&x, "order.placed");
    let mut tx = pool.begin().await.unwrap();
    let id = outbox.enqueue(&mut tx, &publisher, Envelope::new(), &5).await.unwrap();
    tx.commit().await.unwrap();

    let relay = outbox
        .relay(&conn)
        .retry_delay(Duration::from_millis(300), Duration::from_secs(1));
    let batch = relay.run_once().await.unwrap();
    assert_eq!(
        (batch.dispatched, batch.refused),
        (0, 1),
        "{:?}/{}: no queue is bound",
        b.kind,
        name::<DB>()
    );
    let rows = DB::strings(
        &pool,
        "SELECT CAST(attempts AS TEXT), last_error, CAST(dispatched_at AS TEXT) FROM acemq_outbox",
    )
    .await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0][0].as_deref(),
        Some("1"),
        "{:?}/{}: one refusal counted",
        b.kind,
        name::<DB>()
    );
    let error = rows[0][1].clone().unwrap_or_default();
    assert!(
        error.contains("NO_ROUTE") && error.contains(&id),
        "{:?}/{}: the error is kept: {error}",
        b.kind,
        name::<DB>()
    );
    assert_eq!(rows[0][2], None, "not dispatched");
    // Backed off: not tried again at once.
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "{:?}/{}: the row backs off",
        b.kind,
        name::<DB>()
    );

    Topology::new()
        .queue(&q)
        .bind(&q, &x, "order.placed")
        .declare(&conn)
        .await
        .unwrap();
    let running = relay.poll_interval(Duration::from_millis(20)).start();
    let got = take(&conn, &q, 1).await;
    drained(&outbox).await;
    running.stop().await;
    assert_eq!(
        got,
        [id],
        "{:?}/{}: published once its binding is there",
        b.kind,
        name::<DB>()
    );
    let rows = DB::strings(
        &pool,
        "SELECT last_error FROM acemq_outbox WHERE dispatched_at IS NOT NULL",
    )
    .await;
    assert_eq!(
        rows,
        [[None]],
        "{:?}/{}: dispatched, error cleared",
        b.kind,
        name::<DB>()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_an_unroutable_row_stays_with_its_error_and_is_published_once_its_binding_appears() {
    on_databases_and_brokers!(refused_row_waits_for_its_binding);
}

// -------------------------------------------------------------------- inbox

/// A handler that records its work and the inbox row in one transaction.
async fn handle<DB: TestDb>(pool: &Pool<DB>, id: &str, commit: bool) -> Begin {
    let mut tx = pool.begin().await.unwrap();
    let begin = Inbox::try_begin(&mut tx, id, "billing").await.unwrap();
    if begin == Begin::New {
        DB::execute(&mut *tx, &format!("INSERT INTO work (message_id) VALUES ('{id}')")).await;
    }
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    begin
}

async fn inbox_dedupes_with_the_work<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    DB::execute(&mut c, "CREATE TABLE work (message_id TEXT NOT NULL)").await;
    drop(c);
    let conn = conn(b).await;
    let q = queue(&conn).await;
    let id = Envelope::new().id;
    conn.publisher::<u32>("", &q)
        .send_envelope(
            Envelope {
                id: id.clone(),
                ..Envelope::new()
            },
            &9,
        )
        .await
        .unwrap();
    let ch = conn.consuming_connection().channel().await.unwrap();

    // The first delivery's transaction rolls back: neither work nor inbox row.
    let first = ch.basic_get(&q, false).await.unwrap().expect("the message");
    assert_eq!(handle(&pool, &id, false).await, Begin::New);
    first.nack(true).unwrap();
    // The redelivery is new to the inbox, and this time it commits.
    let second = ch.basic_get(&q, false).await.unwrap().expect("redelivered");
    assert!(second.redelivered);
    assert_eq!(
        handle(&pool, &id, true).await,
        Begin::New,
        "{:?}/{}: the rollback took the inbox row",
        b.kind,
        name::<DB>()
    );
    second.nack(true).unwrap();
    // The next redelivery is a duplicate.
    let third = ch.basic_get(&q, false).await.unwrap().expect("redelivered again");
    assert!(third.redelivered);
    assert_eq!(
        handle(&pool, &id, true).await,
        Begin::Duplicate,
        "{:?}/{}",
        b.kind,
        name::<DB>()
    );
    third.ack().unwrap();
    let work = DB::strings(&pool, "SELECT message_id FROM work").await;
    assert_eq!(
        work,
        [[Some(id.clone())]],
        "{:?}/{}: the work was done once",
        b.kind,
        name::<DB>()
    );
    // Another consumer handles it on its own.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(Inbox::try_begin(&mut tx, &id, "shipping").await.unwrap(), Begin::New);
    tx.commit().await.unwrap();
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_the_inbox_answers_duplicate_for_a_redelivered_message_and_commits_with_the_work() {
    on_databases_and_brokers!(inbox_dedupes_with_the_work);
}

// ---------------------------------------------------------------- retention

async fn old_rows_are_removed<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    let (outbox, conn, q) = set_up(b, &pool).await;
    let ids = enqueue_many(&outbox, &pool, &conn, &q, 3).await;
    let relay = outbox.relay(&conn);
    assert_eq!(relay.run_once().await.unwrap().dispatched, 3);
    // One waiting row (unroutable, refused) must survive every clean-up.
    let mut tx = pool.begin().await.unwrap();
    let stuck = outbox
        .enqueue(
            &mut tx,
            &conn.publisher::<u32>("", &unique("nowhere")),
            Envelope::new(),
            &0,
        )
        .await
        .unwrap();
    Inbox::try_begin(&mut tx, &ids[0], "billing").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(relay.run_once().await.unwrap().refused, 1);

    // Within the retention nothing goes.
    assert_eq!(relay.clean_up().await.unwrap(), (0, 0), "{:?}/{}", b.kind, name::<DB>());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let relay = relay
        .retention(Duration::from_millis(10))
        .inbox_retention(Duration::from_millis(10));
    assert_eq!(
        relay.clean_up().await.unwrap(),
        (3, 1),
        "{:?}/{}: dispatched and inbox rows removed",
        b.kind,
        name::<DB>()
    );
    let left = DB::strings(&pool, "SELECT message_id FROM acemq_outbox").await;
    assert_eq!(
        left,
        [[Some(stuck)]],
        "{:?}/{}: the waiting row stays",
        b.kind,
        name::<DB>()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_dispatched_rows_and_old_inbox_rows_are_removed_after_their_retention() {
    on_databases_and_brokers!(old_rows_are_removed);
}

// --------------------------------------------------------------------- load

/// 10,000 rows, each in its own transaction, enqueued by 8 tasks while a
/// relay runs: every row arrives once. Prints the relay's rate and the lag
/// from each commit to its mark (which follows the confirm).
async fn load<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    const TASKS: u32 = 8;
    const ROWS: u32 = 10_000;
    let (outbox, conn, q) = set_up(b, &pool).await;
    let relay = outbox
        .relay(&conn)
        .batch(500)
        .poll_interval(Duration::from_millis(5))
        .start();
    let committed: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    let started = now_ms();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (outbox, pool, committed) = (outbox.clone(), pool.clone(), committed.clone());
        let publisher = conn.publisher::<u32>("", &q);
        tasks.push(tokio::spawn(async move {
            for i in 0..ROWS / TASKS {
                let mut tx = pool.begin().await.unwrap();
                let id = outbox
                    .enqueue(&mut tx, &publisher, Envelope::new(), &(t * ROWS + i))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                committed.lock().unwrap().insert(id, now_ms());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let enqueued = now_ms();
    drained(&outbox).await;
    relay.stop().await;
    let rows = DB::strings(
        &pool,
        "SELECT message_id, CAST(dispatched_at AS TEXT) FROM acemq_outbox",
    )
    .await;
    assert_eq!(rows.len(), ROWS as usize);
    let committed = committed.lock().unwrap().clone();
    let mut lags: Vec<i64> = Vec::new();
    let mut last = 0;
    for row in &rows {
        let dispatched: i64 = row[1].as_deref().unwrap().parse().unwrap();
        last = last.max(dispatched);
        lags.push((dispatched - committed[row[0].as_deref().unwrap()]).max(0));
    }
    lags.sort_unstable();
    let ch = conn.consuming_connection().channel().await.unwrap();
    assert_eq!(
        depth(&ch, &q).await,
        ROWS,
        "{:?}/{}: every row arrived once",
        b.kind,
        name::<DB>()
    );
    let seconds = (last - started) as f64 / 1000.0;
    // The relay alone: a backlog of ROWS committed rows, drained.
    let backlog = enqueue_many(&outbox, &pool, &conn, &q, ROWS).await;
    let drain_started = Instant::now();
    let relay = outbox
        .relay(&conn)
        .batch(500)
        .poll_interval(Duration::from_millis(5))
        .start();
    drained(&outbox).await;
    let drain = drain_started.elapsed();
    relay.stop().await;
    assert_eq!(
        depth(&ch, &q).await as usize,
        ROWS as usize + backlog.len(),
        "{:?}/{}: the backlog arrived once",
        b.kind,
        name::<DB>()
    );
    println!(
        "load {:?}/{}: {ROWS} rows by {TASKS} tasks: enqueued in {:.2} s; all dispatched after {seconds:.2} s \
         = {:.0} rows/s; lag commit -> mark p50 {} ms, p99 {} ms, max {} ms; a backlog of {ROWS} drained in \
         {:.2} s = {:.0} rows/s",
        b.kind,
        name::<DB>(),
        (enqueued - started) as f64 / 1000.0,
        ROWS as f64 / seconds,
        lags[lags.len() / 2],
        lags[lags.len() * 99 / 100],
        lags[lags.len() - 1],
        drain.as_secs_f64(),
        f64::from(ROWS) / drain.as_secs_f64(),
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_load_ten_thousand_rows_from_eight_tasks_are_each_published_once() {
    deadline(async {
        // One broker: RabbitMQ over TCP when it is there (the figure that
        // matters), else acemq-memory.
        let all: Vec<Broker> = brokers().await.into_iter().collect();
        let rabbit = all.iter().any(|b| b.kind == acemq_tests::Kind::RabbitTcp);
        for b in all {
            let wanted = if rabbit {
                acemq_tests::Kind::RabbitTcp
            } else {
                acemq_tests::Kind::Memory
            };
            if b.kind != wanted {
                continue;
            }
            if let Some((place, pool)) = db::postgres().await {
                step("load on PostgreSQL", load::<Postgres>(&b, place, pool)).await;
            }
            let (place, pool) = db::sqlite().await;
            step("load on SQLite", load::<Sqlite>(&b, place, pool)).await;
        }
    })
    .await
}

// ----------------------------------------------------------------- recovery

/// Both connections of the relay's `Conn` are force-closed (320) while it
/// drains 2,000 rows:
/// its sends ride through the recovery, and every row arrives, under its id,
/// with none refused.
async fn relay_rides_through_recovery<DB: TestDb>(b: &Broker, _place: Place, pool: Pool<DB>) {
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let conn_name = unique("outbox-relay");
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = events.clone();
    let conn = b
        .conn_with(
            Config::default()
                .with_recovery_delay(Duration::from_millis(100))
                .with_connection_name(conn_name.clone())
                .with_on_recovery(move |event| seen.lock().unwrap().push(event.to_string())),
        )
        .await;
    let q = queue(&conn).await;
    let ids = enqueue_many(&outbox, &pool, &conn, &q, 2000).await;
    let relay = outbox.relay(&conn).batch(100).start();
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while depth(&ch, &q).await < 500 {
        assert!(Instant::now() < until, "the relay does not publish");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.force_close(&format!("{conn_name}-publish"));
    if b.is_rabbitmq() {
        b.force_close(&format!("{conn_name}-consume"));
    }
    drained(&outbox).await;
    relay.stop().await;
    let recovered = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.contains("recovered the publish connection"));
    assert!(
        recovered,
        "{:?}/{}: the publishing connection recovered: {:?}",
        b.kind,
        name::<DB>(),
        events.lock().unwrap()
    );
    let refused = DB::strings(&pool, "SELECT message_id FROM acemq_outbox WHERE attempts > 0").await;
    assert!(
        refused.is_empty(),
        "{:?}/{}: refused across the recovery: {refused:?}",
        b.kind,
        name::<DB>()
    );
    let until = Instant::now() + Duration::from_secs(20);
    while !conn.is_connected() {
        assert!(Instant::now() < until, "the consuming connection did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ch = conn.consuming_connection().channel().await.unwrap();
    let n = depth(&ch, &q).await as usize;
    let got: HashSet<String> = take(&conn, &q, n).await.into_iter().collect();
    assert_eq!(
        got,
        ids.iter().cloned().collect::<HashSet<_>>(),
        "{:?}/{}: every row arrived",
        b.kind,
        name::<DB>()
    );
    println!(
        "{:?}/{}: {n} deliveries for {} rows across the recovery",
        b.kind,
        name::<DB>(),
        ids.len()
    );
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_27_the_relay_rides_through_a_recovery() {
    on_databases_and_brokers!(relay_rides_through_recovery);
}

// ------------------------------------------------------------------ metrics

/// Three rows that go and one that cannot: counted by outcome.
async fn counted<DB: TestDb>(pool: Pool<DB>) {
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let conn = Conn::open(&format!("memory://{}", unique("outbox-metrics")), Config::default())
        .await
        .unwrap();
    let q = queue(&conn).await;
    enqueue_many(&outbox, &pool, &conn, &q, 3).await;
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            &conn.publisher::<u32>("", &unique("nowhere")),
            Envelope::new(),
            &0,
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let batch = outbox.relay(&conn).run_once().await.unwrap();
    assert_eq!((batch.claimed, batch.dispatched, batch.refused), (4, 3, 1));
    conn.close().await.unwrap();
}

/// What a scenario recorded: `acemq_outbox_total` by outcome, and the last
/// values of the waiting and lag gauges.
fn recorded(scenario: impl std::future::Future<Output = ()>) -> (BTreeMap<String, u64>, f64, f64) {
    use acemq_core::outbox::{OUTBOX_LAG_SECONDS, OUTBOX_TOTAL, OUTBOX_WAITING};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(deadline(scenario)));
    let (mut totals, mut waiting, mut lag) = (BTreeMap::new(), f64::NAN, f64::NAN);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            (OUTBOX_TOTAL, DebugValue::Counter(n)) => {
                let outcome = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "outcome")
                    .unwrap()
                    .value()
                    .to_owned();
                *totals.entry(outcome).or_default() += n;
            }
            (OUTBOX_WAITING, DebugValue::Gauge(v)) => waiting = v.into_inner(),
            (OUTBOX_LAG_SECONDS, DebugValue::Gauge(v)) => lag = v.into_inner(),
            _ => {}
        }
    }
    (totals, waiting, lag)
}

/// Three rows dispatched and one refused are counted; the refused one is
/// still waiting, and the lag gauge gives its age.
#[test]
fn statement_27_the_relay_counts_what_it_dispatched_refused_and_what_lags_behind() {
    let expected = BTreeMap::from([("dispatched".to_owned(), 3), ("refused".to_owned(), 1)]);
    let (totals, waiting, lag) = recorded(async { counted(db::sqlite().await.1).await });
    assert_eq!(totals, expected, "SQLite");
    assert_eq!(waiting, 1.0, "SQLite: the refused row waits");
    assert!((0.0..60.0).contains(&lag), "SQLite: lag {lag} s");
    // Under CI=true a missing PostgreSQL fails in `db::postgres`; elsewhere
    // it skips loudly.
    let postgres = std::env::var("ACEMQ_POSTGRES_URL").is_ok_and(|url| !url.is_empty());
    if postgres || std::env::var("CI").is_ok_and(|v| v == "true") {
        let (totals, waiting, lag) = recorded(async { counted(db::postgres().await.expect("PostgreSQL").1).await });
        assert_eq!(totals, expected, "PostgreSQL");
        assert_eq!(waiting, 1.0, "PostgreSQL: the refused row waits");
        assert!((0.0..60.0).contains(&lag), "PostgreSQL: lag {lag} s");
    }
}
