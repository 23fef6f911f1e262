//! AMQP 0-9-1 reply codes: one table of code, name, and whether the error
//! closes the channel (soft) or the whole connection (hard).

macro_rules! reply_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal, $scope:ident; )*) => {
        /// A reply code as carried by `connection.close`, `channel.close` and
        /// `basic.return`. Codes the table does not know are kept in
        /// [`ReplyCode::Other`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ReplyCode {
            $( $(#[$doc])* $variant, )*
            /// A code outside the AMQP 0-9-1 table.
            Other(u16),
        }

        impl ReplyCode {
            /// The code for a number.
            pub fn from_u16(code: u16) -> Self {
                match code {
                    $( $code => ReplyCode::$variant, )*
                    other => ReplyCode::Other(other),
                }
            }

            /// The number on the wire.
            pub fn code(self) -> u16 {
                match self {
                    $( ReplyCode::$variant => $code, )*
                    ReplyCode::Other(code) => code,
                }
            }

            /// The name RabbitMQ puts at the start of its reply text, e.g. `NOT_FOUND`.
            pub fn name(self) -> &'static str {
                match self {
                    $( ReplyCode::$variant => $name, )*
                    ReplyCode::Other(_) => "UNKNOWN",
                }
            }

            /// Which scope the error closes: [`ErrorScope::Channel`] for soft
            /// errors, [`ErrorScope::Connection`] for hard ones, `None` for
            /// codes that are not errors (200) or unknown.
            pub fn scope(self) -> Option<ErrorScope> {
                match self {
                    $( ReplyCode::$variant => scope!($scope), )*
                    ReplyCode::Other(_) => None,
                }
            }
        }
    };
}

macro_rules! scope {
    (none) => {
        None
    };
    (soft) => {
        Some(ErrorScope::Channel)
    };
    (hard) => {
        Some(ErrorScope::Connection)
    };
}

/// What an error closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorScope {
    /// A soft error: the channel is closed, the connection goes on.
    Channel,
    /// A hard error: the whole connection is closed.
    Connection,
}

reply_codes! {
    /// 200: a normal close.
    Success = 200, "REPLY_SUCCESS", none;
    /// 311: a message too large for the broker.
    ContentTooLarge = 311, "CONTENT_TOO_LARGE", soft;
    /// 312: a mandatory message that reached no queue (in `basic.return`).
    NoRoute = 312, "NO_ROUTE", soft;
    /// 313: an immediate message with no consumer (in `basic.return`).
    NoConsumers = 313, "NO_CONSUMERS", soft;
    /// 320: an operator closed the connection.
    ConnectionForced = 320, "CONNECTION_FORCED", hard;
    /// 402: an unknown virtual host path.
    InvalidPath = 402, "INVALID_PATH", hard;
    /// 403: access refused.
    AccessRefused = 403, "ACCESS_REFUSED", soft;
    /// 404: the entity does not exist.
    NotFound = 404, "NOT_FOUND", soft;
    /// 405: the entity is locked by another connection (exclusive queue).
    ResourceLocked = 405, "RESOURCE_LOCKED", soft;
    /// 406: a precondition failed (inequivalent redeclare, unknown delivery tag).
    PreconditionFailed = 406, "PRECONDITION_FAILED", soft;
    /// 501: a malformed frame.
    FrameError = 501, "FRAME_ERROR", hard;
    /// 502: a frame with bad field values.
    SyntaxError = 502, "SYNTAX_ERROR", hard;
    /// 503: a method not valid here.
    CommandInvalid = 503, "COMMAND_INVALID", hard;
    /// 504: a channel that is not open, or already open.
    ChannelError = 504, "CHANNEL_ERROR", hard;
    /// 505: a frame out of sequence.
    UnexpectedFrame = 505, "UNEXPECTED_FRAME", hard;
    /// 506: the server ran out of a resource.
    ResourceError = 506, "RESOURCE_ERROR", hard;
    /// 530: not allowed (e.g. an unknown vhost at `connection.open`).
    NotAllowed = 530, "NOT_ALLOWED", hard;
    /// 540: not implemented.
    NotImplemented = 540, "NOT_IMPLEMENTED", hard;
    /// 541: an internal error in the server.
    InternalError = 541, "INTERNAL_ERROR", hard;
}

impl std::fmt::Display for ReplyCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code(), self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps_to_itself() {
        for code in 0..=u16::MAX {
            assert_eq!(ReplyCode::from_u16(code).code(), code);
        }
    }

    #[test]
    fn soft_and_hard_codes_follow_rabbitmq() {
        for soft in [311, 312, 313, 403, 404, 405, 406] {
            assert_eq!(ReplyCode::from_u16(soft).scope(), Some(ErrorScope::Channel), "{soft}");
        }
        for hard in [320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541] {
            assert_eq!(
                ReplyCode::from_u16(hard).scope(),
                Some(ErrorScope::Connection),
                "{hard}"
            );
        }
        assert_eq!(ReplyCode::Success.scope(), None);
        assert_eq!(ReplyCode::NoRoute.to_string(), "312 NO_ROUTE");
    }
}
