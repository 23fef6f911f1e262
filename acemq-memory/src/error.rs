//! The errors the broker answers a client with: a reply code, RabbitMQ's
//! reply text, and the method that caused it; and the pieces those texts
//! are written from (how RabbitMQ names a queue, an exchange, a field type,
//! an invalid argument). Must never carry anything a client could not be
//! told.

use std::fmt::Display;

use acemq_codec::{ChannelClose, ConnectionClose, ErrorScope, FieldValue, Method, ReplyCode, ShortString};

/// An AMQP error as the broker reports it in `channel.close` or
/// `connection.close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AmqpError {
    pub code: ReplyCode,
    pub text: String,
    pub class_id: u16,
    pub method_id: u16,
}

impl AmqpError {
    /// `CODE_NAME - detail`, as RabbitMQ writes its reply texts.
    pub fn new(code: ReplyCode, detail: impl Display) -> Self {
        let mut text = format!("{} - {}", code.name(), detail);
        truncate_to_shortstr(&mut text);
        AmqpError {
            code,
            text,
            class_id: 0,
            method_id: 0,
        }
    }

    /// The same error, attributed to `method`.
    pub fn caused_by(mut self, method: &Method) -> Self {
        if self.class_id == 0 {
            self.class_id = method.class_id();
            self.method_id = method.method_id();
        }
        self
    }

    /// Whether it closes the whole connection.
    pub fn is_hard(&self) -> bool {
        self.code.scope() != Some(ErrorScope::Channel)
    }

    /// The method that reports it: `channel.close` on channel `channel`, or
    /// `connection.close` when `channel` is 0.
    pub fn close_method(&self, channel: u16) -> Method {
        let (reply_code, reply_text) = (self.code.code(), self.text.as_str().into());
        let (class_id, method_id) = (self.class_id, self.method_id);
        if channel == 0 {
            ConnectionClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            }
            .into()
        } else {
            ChannelClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            }
            .into()
        }
    }

    pub fn not_found(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::NotFound, detail)
    }

    pub fn precondition(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::PreconditionFailed, detail)
    }

    pub fn access_refused(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::AccessRefused, detail)
    }

    pub fn resource_locked(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::ResourceLocked, detail)
    }

    pub fn not_implemented(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::NotImplemented, detail)
    }

    pub fn command_invalid(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::CommandInvalid, detail)
    }

    pub fn channel_error(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::ChannelError, detail)
    }

    pub fn not_allowed(detail: impl Display) -> Self {
        AmqpError::new(ReplyCode::NotAllowed, detail)
    }

    pub fn no_queue(queue: &ShortString, vhost: &str) -> Self {
        AmqpError::not_found(format!("no queue '{queue}' in vhost '{vhost}'"))
    }

    pub fn no_exchange(exchange: &ShortString, vhost: &str) -> Self {
        AmqpError::not_found(format!("no exchange '{exchange}' in vhost '{vhost}'"))
    }

    pub fn queue_locked(queue: &ShortString, vhost: &str) -> Self {
        AmqpError::resource_locked(format!(
            "cannot obtain exclusive access to locked queue '{queue}' in vhost '{vhost}'. It could be originally \
             declared on another connection or the exclusive property value does not match that of the original \
             declaration."
        ))
    }
}

/// Reply texts are short strings: keep them under 256 bytes on a char boundary.
fn truncate_to_shortstr(text: &mut String) {
    if text.len() > 255 {
        let mut end = 255;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// RabbitMQ's `rabbit_misc:rs/1` for a queue: `queue 'q' in vhost '/'`.
pub(crate) fn rs_queue(queue: &ShortString, vhost: &str) -> String {
    format!("queue '{queue}' in vhost '{vhost}'")
}

/// RabbitMQ's `rabbit_misc:rs/1` for an exchange.
pub(crate) fn rs_exchange(exchange: &ShortString, vhost: &str) -> String {
    format!("exchange '{exchange}' in vhost '{vhost}'")
}

/// `invalid arg 'K' for queue 'Q' in vhost 'V': WHY`, RabbitMQ's refusal of
/// a declaration argument.
pub(crate) fn invalid(key: &str, queue: &ShortString, vhost: &str, why: impl std::fmt::Display) -> AmqpError {
    AmqpError::precondition(format!("invalid arg '{key}' for {}: {why}", rs_queue(queue, vhost)))
}

/// RabbitMQ's name for a field type, as it appears in reply texts.
pub(crate) fn type_name(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) | FieldValue::I64L(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(_) => "decimal",
        FieldValue::LongString(_) => "longstr",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
        FieldValue::ByteArray(_) => "binary",
    }
}
