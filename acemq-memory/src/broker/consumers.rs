//! Which of a queue's consumers a message goes to, as RabbitMQ 3.10.8
//! chooses: consumer priorities (`x-priority`: the highest priority
//! consumers with room get the messages, round-robin among equals; lower
//! ones only while every higher one is blocked) and single active consumer
//! (one consumer gets everything; when it goes, the next takes over). It
//! only chooses; delivering is the broker's.

use acemq_codec::ShortString;

use super::args::QueueKind;
use super::ids::ConnId;
use super::queue::{ConsumerRef, Queue};
use super::{BrokerMachine, Unacked};

impl ConsumerRef {
    fn is(&self, key: &(ConnId, u16, ShortString)) -> bool {
        self.conn == key.0 && self.channel == key.1 && self.tag == key.2
    }

    fn key(&self) -> (ConnId, u16, ShortString) {
        (self.conn, self.channel, self.tag.clone())
    }
}

impl Queue {
    /// Registers a consumer; under single active consumer the first one is
    /// the active one (a later one, whatever its priority, waits).
    pub fn attach_consumer(&mut self, consumer: ConsumerRef) {
        if self.settings.single_active_consumer && self.active.is_none() {
            self.active = Some(consumer.key());
        }
        self.consumers.push(consumer);
        self.had_consumers = true;
        self.update_levels();
    }

    /// Removes a consumer. Returns whether another consumer became the
    /// single active one (so the queue should be dispatched).
    pub fn remove_consumer(&mut self, conn: ConnId, channel: u16, tag: &ShortString) -> bool {
        self.consumers
            .retain(|c| !(c.conn == conn && c.channel == channel && &c.tag == tag));
        self.update_levels();
        let was_active = self
            .active
            .as_ref()
            .is_some_and(|(c, ch, t)| *c == conn && *ch == channel && t == tag);
        if !was_active {
            return false;
        }
        self.active = self.next_active().map(ConsumerRef::key);
        self.active.is_some()
    }

    /// Forgets every consumer (a restart).
    pub fn clear_consumers(&mut self) {
        self.consumers.clear();
        self.active = None;
        self.lingering.clear();
        self.update_levels();
    }

    /// A consumer was cancelled holding `unacked` messages: a quorum queue
    /// goes on counting it until they are settled.
    pub fn cancelled_holding(&mut self, conn: ConnId, channel: u16, tag: ShortString, unacked: u32) {
        if self.settings.kind == QueueKind::Quorum && unacked > 0 {
            self.lingering.push(((conn, channel, tag), unacked));
        }
    }

    /// One unacked message of a cancelled consumer was settled or returned.
    pub fn settled_by(&mut self, conn: ConnId, channel: u16, tag: &ShortString) {
        let Some(at) = self
            .lingering
            .iter()
            .position(|((c, ch, t), _)| *c == conn && *ch == channel && t == tag)
        else {
            return;
        };
        self.lingering[at].1 -= 1;
        if self.lingering[at].1 == 0 {
            self.lingering.remove(at);
        }
    }

    /// Who takes over from a single active consumer that went: a classic
    /// queue picks the highest priority, then the earliest registered; a
    /// quorum queue the earliest registered, whatever its priority (both as
    /// RabbitMQ 3.10.8 does).
    fn next_active(&self) -> Option<&ConsumerRef> {
        match self.settings.kind {
            QueueKind::Classic => {
                let top = self.consumers.iter().map(|c| c.priority).max()?;
                self.consumers.iter().find(|c| c.priority == top)
            }
            _ => self.consumers.first(),
        }
    }

    fn update_levels(&mut self) {
        let mut levels: Vec<i64> = self.consumers.iter().map(|c| c.priority).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        self.consumer_levels = levels;
    }

    /// The consumers to offer the next message to, in order: only the active
    /// one under single active consumer; otherwise by priority, highest
    /// first, each level round-robin from where the last delivery left off.
    pub fn candidates(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.consumers.len();
        let start = self.round_robin;
        let single = self.settings.single_active_consumer;
        let active = single
            .then(|| {
                let key = self.active.as_ref()?;
                self.consumers.iter().position(|c| c.is(key))
            })
            .flatten();
        let levels: &[i64] = if single { &[] } else { &self.consumer_levels };
        active.into_iter().chain(levels.iter().flat_map(move |&level| {
            (0..n)
                .map(move |i| (start + i) % n)
                .filter(move |&idx| self.consumers[idx].priority == level)
        }))
    }
}

impl BrokerMachine {
    /// Unacked deliveries of cancelled consumers on channel `ch` of `id`
    /// left the channel (settled or returned): their quorum queues stop
    /// counting those consumers once none is left.
    pub(crate) fn settled_by_cancelled<'a>(
        &mut self,
        vhost: &str,
        id: ConnId,
        ch: u16,
        entries: impl Iterator<Item = &'a Unacked>,
    ) {
        let Some(vh) = self.vhosts.get_mut(vhost) else { return };
        for entry in entries {
            let Some(tag) = &entry.consumer else { continue };
            if let Some(q) = vh.queues.get_mut(&entry.queue) {
                if !q.lingering.is_empty() {
                    q.settled_by(id, ch, tag);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use acemq_codec::{
        BasicAck, BasicCancel, BasicConsume, BasicNack, BasicPublish, BasicQos, FieldTable, Method, Properties,
        QueueDeclare,
    };

    use crate::broker::message::Header;
    use crate::broker::{BrokerMachine, ConnId, Publication};
    use crate::session::Session;
    use crate::BrokerConfig;

    fn method(machine: &mut BrokerMachine, id: ConnId, ch: u16, m: impl Into<Method>, now: Instant) {
        machine
            .channel_method(id, ch, m.into(), now)
            .expect("the broker takes it");
    }

    fn count(machine: &BrokerMachine, queue: &str) -> usize {
        machine.vhosts["/"].queues[&queue.into()].consumer_count()
    }

    /// Channel 2 consumes `q` (a quorum queue) as `tag` and gets one message.
    fn consuming(machine: &mut BrokerMachine, id: ConnId, tag: &str, now: Instant) {
        method(
            machine,
            id,
            2,
            BasicQos {
                prefetch_count: 10,
                ..Default::default()
            },
            now,
        );
        let consume = BasicConsume {
            queue: "q".into(),
            consumer_tag: tag.into(),
            ..Default::default()
        };
        method(machine, id, 2, consume, now);
        let publication = Publication {
            publish: BasicPublish {
                routing_key: "q".into(),
                ..Default::default()
            },
            header: Header::Decoded(Properties::default()),
            body: "m".into(),
        };
        machine.publish(id, 1, publication, now).expect("published");
        let cancel = BasicCancel {
            consumer_tag: tag.into(),
            no_wait: false,
        };
        method(machine, id, 2, cancel, now);
    }

    #[test]
    fn a_quorum_queue_counts_a_cancelled_consumer_until_its_messages_are_settled() {
        let now = Instant::now();
        let mut machine = BrokerMachine::new(BrokerConfig::default(), now);
        let mut session = Session::new(&mut machine, now);
        session.handle_input(&mut machine, &mut crate::fuzzing::handshake(0), now);
        let id = session.id();
        let mut arguments = FieldTable::new();
        arguments.insert("x-queue-type", "quorum");
        let declare = QueueDeclare {
            queue: "q".into(),
            durable: true,
            arguments,
            ..Default::default()
        };
        method(&mut machine, id, 1, declare, now);

        consuming(&mut machine, id, "acked", now);
        assert_eq!(count(&machine, "q"), 1, "cancelled, holding one message");
        method(
            &mut machine,
            id,
            2,
            BasicAck {
                delivery_tag: 1,
                multiple: false,
            },
            now,
        );
        assert_eq!(count(&machine, "q"), 0, "its message acked");

        consuming(&mut machine, id, "nacked", now);
        assert_eq!(count(&machine, "q"), 1);
        let nack = BasicNack {
            delivery_tag: 2,
            multiple: false,
            requeue: true,
        };
        method(&mut machine, id, 2, nack, now);
        assert_eq!(count(&machine, "q"), 0, "its message returned");
    }
}
