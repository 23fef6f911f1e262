//! The macro that turns the method table into structs, the `Method` enum, and
//! their decoders and encoders. Reading the table in `table.rs` should be
//! enough to know the wire format; this file only mechanises it.

/// The Rust type of an AMQP domain.
macro_rules! field_type {
    (octet) => {
        u8
    };
    (short) => {
        u16
    };
    (long) => {
        u32
    };
    (longlong) => {
        u64
    };
    (timestamp) => {
        u64
    };
    (bit) => {
        bool
    };
    (shortstr) => {
        $crate::types::ShortString
    };
    (longstr) => {
        $crate::types::LongString
    };
    (table) => {
        $crate::types::FieldTable
    };
}

macro_rules! methods {
    ($(
        $(#[$class_doc:meta])*
        class $class_const:ident = $class_id:literal, $class_name:literal {
            $(
                $(#[$method_doc:meta])*
                $method:ident = $method_id:literal, $wire_name:literal, content = $content:literal {
                    $( $(#[$field_doc:meta])* $field:ident : $domain:ident ),* $(,)?
                }
            )*
        }
    )*) => {
        /// Class ids.
        pub mod class {
            $( $(#[$class_doc])* pub const $class_const: u16 = $class_id; )*
        }

        $( $(
            $(#[$method_doc])*
            #[doc = ""]
            #[doc = concat!("`", $class_name, ".", $wire_name, "` (", stringify!($class_id), ", ", stringify!($method_id), ").")]
            #[derive(Debug, Clone, PartialEq, Default)]
            pub struct $method {
                $( $(#[$field_doc])* pub $field: field_type!($domain), )*
            }

            impl $method {
                /// The class id on the wire.
                pub const CLASS_ID: u16 = $class_id;
                /// The method id on the wire.
                pub const METHOD_ID: u16 = $method_id;
                /// The method's name, e.g. `basic.deliver`.
                pub const NAME: &'static str = concat!($class_name, ".", $wire_name);

                #[allow(unused_mut, unused_variables)]
                fn decode_args(r: $crate::parse::ArgReader<'_>) -> Result<Self, $crate::error::DecodeErrorKind> {
                    let mut method = Self::default();
                    method.decode_args_into(r)?;
                    Ok(method)
                }

                /// Decodes the arguments into `self`, field by field, where they lie.
                #[allow(unused_mut, unused_variables)]
                #[inline(always)]
                pub(crate) fn decode_args_into(
                    &mut self,
                    mut r: $crate::parse::ArgReader<'_>,
                ) -> Result<(), $crate::error::DecodeErrorKind> {
                    $( $crate::parse::ReadField::read_into(&mut self.$field, &mut r)?; )*
                    r.finish()
                }

                #[allow(unused_mut, unused_variables)]
                fn encode_args(&self, mut w: $crate::parse::ArgWriter<'_>) -> Result<(), $crate::error::EncodeError> {
                    $( w.$domain(&self.$field)?; )*
                    Ok(())
                }
            }

            impl From<$method> for Method {
                fn from(m: $method) -> Method {
                    Method::$method(m)
                }
            }
        )* )*

        /// Every method of AMQP 0-9-1 as RabbitMQ speaks it, both directions.
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub enum Method {
            $( $(
                #[doc = concat!("`", $class_name, ".", $wire_name, "`")]
                $method($method),
            )* )*
        }

        impl Method {
            /// The class id on the wire.
            pub fn class_id(&self) -> u16 {
                match self { $( $( Method::$method(_) => $class_id, )* )* }
            }

            /// The method id on the wire.
            pub fn method_id(&self) -> u16 {
                match self { $( $( Method::$method(_) => $method_id, )* )* }
            }

            /// The method's name, e.g. `basic.deliver`.
            pub fn name(&self) -> &'static str {
                match self { $( $( Method::$method(_) => $method::NAME, )* )* }
            }

            /// Whether a content header and body frames follow this method.
            pub fn has_content(&self) -> bool {
                match self { $( $( Method::$method(_) => $content, )* )* }
            }

            /// Whether the method with these ids carries content (`false` for
            /// ids that name no method).
            #[inline]
            pub(crate) fn ids_have_content(class_id: u16, method_id: u16) -> bool {
                match (class_id, method_id) {
                    $( $( ($class_id, $method_id) => $content, )* )*
                    _ => false,
                }
            }

            /// The name of the method with these ids, if there is one.
            pub fn name_of(class_id: u16, method_id: u16) -> Option<&'static str> {
                match (class_id, method_id) {
                    $( $( ($class_id, $method_id) => Some($method::NAME), )* )*
                    _ => None,
                }
            }

            /// Decodes the arguments that follow the class and method ids.
            pub(crate) fn decode_args(
                class_id: u16,
                method_id: u16,
                r: $crate::parse::ArgReader<'_>,
            ) -> Result<Method, $crate::error::Error> {
                match (class_id, method_id) {
                    $( $(
                        ($class_id, $method_id) => $method::decode_args(r)
                            .map(Method::$method)
                            .map_err(|kind| $crate::error::Error::Malformed { context: $method::NAME, kind }),
                    )* )*
                    (class, method) => Err($crate::error::Error::UnknownMethod { class, method }),
                }
            }

            /// One default value of every method, for tests that must cover them all.
            #[cfg(test)]
            pub(crate) fn all_defaults() -> Vec<Method> {
                vec![ $( $( Method::$method($method::default()), )* )* ]
            }

            /// Every method with arbitrary arguments, for property tests.
            #[cfg(test)]
            pub(crate) fn arbitrary() -> proptest::strategy::BoxedStrategy<Method> {
                use proptest::strategy::Strategy;
                proptest::strategy::Union::new(vec![
                    $( $(
                        (proptest::strategy::Just(()), $( $crate::arbitrary::$domain(), )*)
                            .prop_map(|(_, $( $field, )*)| Method::$method($method { $( $field, )* }))
                            .boxed(),
                    )* )*
                ])
                .boxed()
            }

            /// Appends the class id, the method id and the arguments.
            pub fn encode(&self, dst: &mut bytes::BytesMut) -> Result<(), $crate::error::EncodeError> {
                use bytes::BufMut;
                dst.put_u16(self.class_id());
                dst.put_u16(self.method_id());
                let w = $crate::parse::ArgWriter::new(dst);
                match self { $( $( Method::$method(m) => m.encode_args(w), )* )* }
            }
        }
    };
}
