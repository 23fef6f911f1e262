//! The method table: every class and method of AMQP 0-9-1 with RabbitMQ's
//! extensions, their ids, whether content follows, and their fields in wire
//! order. Field names follow the 0-9-1 XML (`reserved_1` where the spec
//! reserves a field; `kind` for `type`).

methods! {
    /// `connection` (10).
    class CONNECTION = 10, "connection" {
        /// Server → client: the first method, offering versions, mechanisms and locales.
        ConnectionStart = 10, "start", content = false {
            /// Protocol major version (0).
            version_major: octet,
            /// Protocol minor version (9).
            version_minor: octet,
            /// The server's properties (product, version, capabilities, ...).
            server_properties: table,
            /// Space-separated SASL mechanisms.
            mechanisms: longstr,
            /// Space-separated locales.
            locales: longstr,
        }
        /// Client → server: chosen mechanism, response and client properties.
        ConnectionStartOk = 11, "start-ok", content = false {
            /// The client's properties, including its capabilities table.
            client_properties: table,
            /// The chosen SASL mechanism.
            mechanism: shortstr,
            /// The SASL response (for PLAIN: `\0user\0password`).
            response: longstr,
            /// The chosen locale.
            locale: shortstr,
        }
        /// Server → client: a SASL challenge.
        ConnectionSecure = 20, "secure", content = false {
            /// The challenge.
            challenge: longstr,
        }
        /// Client → server: a SASL response to a challenge.
        ConnectionSecureOk = 21, "secure-ok", content = false {
            /// The response.
            response: longstr,
        }
        /// Server → client: the server's limits.
        ConnectionTune = 30, "tune", content = false {
            /// Highest channel number (0 = no limit).
            channel_max: short,
            /// Largest frame size in bytes (0 = no limit).
            frame_max: long,
            /// Heartbeat interval in seconds (0 = none).
            heartbeat: short,
        }
        /// Client → server: the negotiated limits.
        ConnectionTuneOk = 31, "tune-ok", content = false {
            /// Highest channel number.
            channel_max: short,
            /// Largest frame size in bytes.
            frame_max: long,
            /// Heartbeat interval in seconds.
            heartbeat: short,
        }
        /// Client → server: open a virtual host.
        ConnectionOpen = 40, "open", content = false {
            /// The virtual host.
            virtual_host: shortstr,
            /// Reserved (`capabilities` in 0-8).
            reserved_1: shortstr,
            /// Reserved (`insist` in 0-8).
            reserved_2: bit,
        }
        /// Server → client: the virtual host is open.
        ConnectionOpenOk = 41, "open-ok", content = false {
            /// Reserved (`known-hosts` in 0-8).
            reserved_1: shortstr,
        }
        /// Either direction: close the connection, with the reason.
        ConnectionClose = 50, "close", content = false {
            /// The reply code (200 for a normal close).
            reply_code: short,
            /// The reply text.
            reply_text: shortstr,
            /// The class of the method that caused the close, or 0.
            class_id: short,
            /// The method that caused the close, or 0.
            method_id: short,
        }
        /// Either direction: the close is acknowledged.
        ConnectionCloseOk = 51, "close-ok", content = false {}
        /// Server → client (RabbitMQ): publishing is blocked by an alarm.
        ConnectionBlocked = 60, "blocked", content = false {
            /// Why, e.g. `low on memory`.
            reason: shortstr,
        }
        /// Server → client (RabbitMQ): the block is lifted.
        ConnectionUnblocked = 61, "unblocked", content = false {}
        /// Client → server (RabbitMQ): a new secret (e.g. an OAuth token).
        ConnectionUpdateSecret = 70, "update-secret", content = false {
            /// The new secret.
            new_secret: longstr,
            /// Why it is being updated.
            reason: shortstr,
        }
        /// Server → client (RabbitMQ): the secret was accepted.
        ConnectionUpdateSecretOk = 71, "update-secret-ok", content = false {}
    }

    /// `channel` (20).
    class CHANNEL = 20, "channel" {
        /// Client → server: open a channel.
        ChannelOpen = 10, "open", content = false {
            /// Reserved (`out-of-band` in 0-8).
            reserved_1: shortstr,
        }
        /// Server → client: the channel is open.
        ChannelOpenOk = 11, "open-ok", content = false {
            /// Reserved (`channel-id` in 0-8).
            reserved_1: longstr,
        }
        /// Either direction: pause or resume content flow.
        ChannelFlow = 20, "flow", content = false {
            /// Whether content may flow.
            active: bit,
        }
        /// Either direction: the flow change is acknowledged.
        ChannelFlowOk = 21, "flow-ok", content = false {
            /// The current setting.
            active: bit,
        }
        /// Either direction: close the channel, with the reason.
        ChannelClose = 40, "close", content = false {
            /// The reply code.
            reply_code: short,
            /// The reply text.
            reply_text: shortstr,
            /// The class of the method that caused the close, or 0.
            class_id: short,
            /// The method that caused the close, or 0.
            method_id: short,
        }
        /// Either direction: the close is acknowledged.
        ChannelCloseOk = 41, "close-ok", content = false {}
    }

    /// `exchange` (40).
    class EXCHANGE = 40, "exchange" {
        /// Declare (or check, when passive) an exchange.
        ExchangeDeclare = 10, "declare", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The exchange name.
            exchange: shortstr,
            /// The exchange type (`direct`, `fanout`, `topic`, `headers`, ...).
            kind: shortstr,
            /// Only check that it exists.
            passive: bit,
            /// Survive a broker restart.
            durable: bit,
            /// Delete when the last binding is removed.
            auto_delete: bit,
            /// Not publishable by clients, only by exchange-to-exchange bindings.
            internal: bit,
            /// Do not send `declare-ok`.
            no_wait: bit,
            /// Arguments (e.g. `alternate-exchange`).
            arguments: table,
        }
        /// The exchange is declared.
        ExchangeDeclareOk = 11, "declare-ok", content = false {}
        /// Delete an exchange.
        ExchangeDelete = 20, "delete", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The exchange name.
            exchange: shortstr,
            /// Only if it has no bindings.
            if_unused: bit,
            /// Do not send `delete-ok`.
            no_wait: bit,
        }
        /// The exchange is deleted.
        ExchangeDeleteOk = 21, "delete-ok", content = false {}
        /// Bind an exchange to an exchange (RabbitMQ).
        ExchangeBind = 30, "bind", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The exchange messages go to.
            destination: shortstr,
            /// The exchange messages come from.
            source: shortstr,
            /// The binding key.
            routing_key: shortstr,
            /// Do not send `bind-ok`.
            no_wait: bit,
            /// Binding arguments (headers exchanges match on these).
            arguments: table,
        }
        /// The binding is made.
        ExchangeBindOk = 31, "bind-ok", content = false {}
        /// Remove an exchange-to-exchange binding (RabbitMQ).
        ExchangeUnbind = 40, "unbind", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The exchange messages went to.
            destination: shortstr,
            /// The exchange messages came from.
            source: shortstr,
            /// The binding key.
            routing_key: shortstr,
            /// Do not send `unbind-ok`.
            no_wait: bit,
            /// Binding arguments.
            arguments: table,
        }
        /// The binding is removed. RabbitMQ numbers it 51, not 41.
        ExchangeUnbindOk = 51, "unbind-ok", content = false {}
    }

    /// `queue` (50).
    class QUEUE = 50, "queue" {
        /// Declare (or check, when passive) a queue.
        QueueDeclare = 10, "declare", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue name; empty asks the server to name it.
            queue: shortstr,
            /// Only check that it exists.
            passive: bit,
            /// Survive a broker restart.
            durable: bit,
            /// Used by this connection only, deleted when it closes.
            exclusive: bit,
            /// Delete when the last consumer is cancelled.
            auto_delete: bit,
            /// Do not send `declare-ok`.
            no_wait: bit,
            /// Arguments (`x-queue-type`, `x-message-ttl`, ...).
            arguments: table,
        }
        /// The queue is declared.
        QueueDeclareOk = 11, "declare-ok", content = false {
            /// The queue's name (server-chosen if it was empty).
            queue: shortstr,
            /// Messages ready in it.
            message_count: long,
            /// Consumers on it.
            consumer_count: long,
        }
        /// Bind a queue to an exchange.
        QueueBind = 20, "bind", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// The exchange.
            exchange: shortstr,
            /// The binding key.
            routing_key: shortstr,
            /// Do not send `bind-ok`.
            no_wait: bit,
            /// Binding arguments.
            arguments: table,
        }
        /// The binding is made.
        QueueBindOk = 21, "bind-ok", content = false {}
        /// Remove every ready message of a queue.
        QueuePurge = 30, "purge", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// Do not send `purge-ok`.
            no_wait: bit,
        }
        /// The queue is purged.
        QueuePurgeOk = 31, "purge-ok", content = false {
            /// How many messages were removed.
            message_count: long,
        }
        /// Delete a queue.
        QueueDelete = 40, "delete", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// Only if it has no consumers.
            if_unused: bit,
            /// Only if it has no messages.
            if_empty: bit,
            /// Do not send `delete-ok`.
            no_wait: bit,
        }
        /// The queue is deleted.
        QueueDeleteOk = 41, "delete-ok", content = false {
            /// How many messages were deleted with it.
            message_count: long,
        }
        /// Remove a queue binding.
        QueueUnbind = 50, "unbind", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// The exchange.
            exchange: shortstr,
            /// The binding key.
            routing_key: shortstr,
            /// Binding arguments.
            arguments: table,
        }
        /// The binding is removed.
        QueueUnbindOk = 51, "unbind-ok", content = false {}
    }

    /// `basic` (60).
    class BASIC = 60, "basic" {
        /// Set the prefetch window.
        BasicQos = 10, "qos", content = false {
            /// Prefetch window in bytes (RabbitMQ supports only 0).
            prefetch_size: long,
            /// Prefetch window in messages (0 = unlimited).
            prefetch_count: short,
            /// RabbitMQ: per channel when true, per consumer when false.
            global: bit,
        }
        /// The window is set.
        BasicQosOk = 11, "qos-ok", content = false {}
        /// Start a consumer.
        BasicConsume = 20, "consume", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// The consumer tag; empty asks the server to choose one.
            consumer_tag: shortstr,
            /// Do not deliver messages published on this connection (ignored by RabbitMQ).
            no_local: bit,
            /// Deliveries need no acknowledgement.
            no_ack: bit,
            /// The only consumer of the queue.
            exclusive: bit,
            /// Do not send `consume-ok`.
            no_wait: bit,
            /// Arguments (`x-stream-offset`, `x-priority`, ...).
            arguments: table,
        }
        /// The consumer is started.
        BasicConsumeOk = 21, "consume-ok", content = false {
            /// The consumer tag.
            consumer_tag: shortstr,
        }
        /// Cancel a consumer (either direction in RabbitMQ: the server
        /// cancels when the queue goes away).
        BasicCancel = 30, "cancel", content = false {
            /// The consumer tag.
            consumer_tag: shortstr,
            /// Do not send `cancel-ok`.
            no_wait: bit,
        }
        /// The consumer is cancelled.
        BasicCancelOk = 31, "cancel-ok", content = false {
            /// The consumer tag.
            consumer_tag: shortstr,
        }
        /// Publish a message (content follows).
        BasicPublish = 40, "publish", content = true {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The exchange; empty is the default exchange.
            exchange: shortstr,
            /// The routing key.
            routing_key: shortstr,
            /// Return the message if no queue takes it.
            mandatory: bit,
            /// Return the message if no consumer takes it at once (RabbitMQ refuses it).
            immediate: bit,
        }
        /// Server → client: a message that could not be routed (content follows).
        BasicReturn = 50, "return", content = true {
            /// Why, e.g. 312.
            reply_code: short,
            /// Why, as text, e.g. `NO_ROUTE`.
            reply_text: shortstr,
            /// The exchange it was published to.
            exchange: shortstr,
            /// The routing key it was published with.
            routing_key: shortstr,
        }
        /// Server → client: a message for a consumer (content follows).
        BasicDeliver = 60, "deliver", content = true {
            /// The consumer it is for.
            consumer_tag: shortstr,
            /// The channel-wide delivery tag, from 1.
            delivery_tag: longlong,
            /// Whether it was delivered before.
            redelivered: bit,
            /// The exchange it was published to.
            exchange: shortstr,
            /// The routing key it was published with.
            routing_key: shortstr,
        }
        /// Fetch one message.
        BasicGet = 70, "get", content = false {
            /// Reserved (`ticket` in 0-8).
            reserved_1: short,
            /// The queue.
            queue: shortstr,
            /// The message needs no acknowledgement.
            no_ack: bit,
        }
        /// A message for `basic.get` (content follows).
        BasicGetOk = 71, "get-ok", content = true {
            /// The delivery tag.
            delivery_tag: longlong,
            /// Whether it was delivered before.
            redelivered: bit,
            /// The exchange it was published to.
            exchange: shortstr,
            /// The routing key it was published with.
            routing_key: shortstr,
            /// Messages left in the queue.
            message_count: long,
        }
        /// No message for `basic.get`.
        BasicGetEmpty = 72, "get-empty", content = false {
            /// Reserved (`cluster-id` in 0-8).
            reserved_1: shortstr,
        }
        /// Acknowledge deliveries; server → client, a publisher confirm.
        BasicAck = 80, "ack", content = false {
            /// The delivery tag (or publish sequence number).
            delivery_tag: longlong,
            /// Up to and including this tag.
            multiple: bit,
        }
        /// Reject one delivery.
        BasicReject = 90, "reject", content = false {
            /// The delivery tag.
            delivery_tag: longlong,
            /// Put it back in the queue (else dead-letter or drop it).
            requeue: bit,
        }
        /// Redeliver unacknowledged messages, without a reply (deprecated).
        BasicRecoverAsync = 100, "recover-async", content = false {
            /// Requeue rather than redeliver to the same consumer.
            requeue: bit,
        }
        /// Redeliver unacknowledged messages.
        BasicRecover = 110, "recover", content = false {
            /// Requeue rather than redeliver to the same consumer.
            requeue: bit,
        }
        /// The recover is done.
        BasicRecoverOk = 111, "recover-ok", content = false {}
        /// Reject deliveries (RabbitMQ); server → client, a negative publisher confirm.
        BasicNack = 120, "nack", content = false {
            /// The delivery tag (or publish sequence number).
            delivery_tag: longlong,
            /// Up to and including this tag.
            multiple: bit,
            /// Put them back in the queue.
            requeue: bit,
        }
    }

    /// `confirm` (85, RabbitMQ).
    class CONFIRM = 85, "confirm" {
        /// Put the channel in publisher-confirm mode.
        ConfirmSelect = 10, "select", content = false {
            /// Do not send `select-ok`.
            no_wait: bit,
        }
        /// The channel confirms publishes from now on, numbering them from 1.
        ConfirmSelectOk = 11, "select-ok", content = false {}
    }

    /// `tx` (90).
    class TX = 90, "tx" {
        /// Put the channel in transaction mode.
        TxSelect = 10, "select", content = false {}
        /// The channel is transactional.
        TxSelectOk = 11, "select-ok", content = false {}
        /// Commit the current transaction.
        TxCommit = 20, "commit", content = false {}
        /// The transaction is committed.
        TxCommitOk = 21, "commit-ok", content = false {}
        /// Abandon the current transaction.
        TxRollback = 30, "rollback", content = false {}
        /// The transaction is rolled back.
        TxRollbackOk = 31, "rollback-ok", content = false {}
    }
}
