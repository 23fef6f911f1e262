//! Which of a queue's consumers a message goes to, as RabbitMQ 3.10.8
//! chooses: consumer priorities (`x-priority`: the highest priority
//! consumers with room get the messages, round-robin among equals; lower
//! ones only while every higher one is blocked) and single active consumer
//! (one consumer gets everything; when it goes, the next takes over). It
//! only chooses; delivering is the broker's.

use amqp_codec::ShortString;

use super::args::QueueKind;
use super::ids::ConnId;
use super::queue::{ConsumerRef, Queue};

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
        self.update_levels();
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
