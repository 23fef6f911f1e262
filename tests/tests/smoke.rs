use acemq_core::amqp::Confirmation;
use acemq_tests::brokers;
use amqp_codec::{BasicProperties, QueueDeclare};

#[tokio::test(flavor = "multi_thread")]
async fn smoke() {
    for b in brokers().await {
        let conn = b.connect().await;
        println!("{:?} {:?}", b.kind, conn.tuned());
        let ch = conn.channel().await.unwrap();
        ch.confirm_select().await.unwrap();
        let q = ch
            .queue_declare(QueueDeclare {
                exclusive: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .unwrap();
        let c = ch
            .publish(
                "",
                q.queue.as_str().unwrap(),
                true,
                BasicProperties::default(),
                "hi".into(),
            )
            .unwrap();
        assert_eq!(c.await.unwrap(), Confirmation::Ack);
        let g = ch.basic_get(q.queue.as_str().unwrap(), false).await.unwrap().unwrap();
        assert_eq!(&g.body[..], b"hi");
        g.ack().unwrap();
        conn.close().await.unwrap();
    }
}
