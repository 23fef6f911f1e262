//! `FrameDecoder::take_ack` reads exactly what `decode` reads: for any
//! bytes, it takes a frame only when `decode` would give a `basic.ack` or
//! `basic.nack` with the same fields from the same bytes, and leaves
//! everything else (a corrupt frame included) to `decode`.

use acemq_codec::{encode_method, AckFrame, BasicAck, BasicNack, Frame, FrameDecoder, Method};
use bytes::{BufMut, BytesMut};
use proptest::prelude::*;

/// What `decode` makes of `buf`, as an `AckFrame` when it is one on a
/// channel other than 0, with the bytes it leaves.
fn decoded_ack(decoder: &FrameDecoder, mut buf: BytesMut) -> (Option<AckFrame>, BytesMut) {
    let ack = match decoder.decode(&mut buf) {
        Ok(Some(Frame::Method(channel, Method::BasicAck(ack)))) if channel != 0 => Some(AckFrame {
            channel,
            nack: false,
            delivery_tag: ack.delivery_tag,
            multiple: ack.multiple,
            requeue: false,
        }),
        Ok(Some(Frame::Method(channel, Method::BasicNack(nack)))) if channel != 0 => Some(AckFrame {
            channel,
            nack: true,
            delivery_tag: nack.delivery_tag,
            multiple: nack.multiple,
            requeue: nack.requeue,
        }),
        _ => None,
    };
    (ack, buf)
}

#[derive(Debug, Clone)]
enum Change {
    None,
    /// One byte of the frame flipped by a mask.
    Flip(usize, u8),
    /// The frame cut short.
    Cut(usize),
    /// The bits octet with every bit set, not only the defined ones.
    AllBits,
}

proptest! {
    #[test]
    fn take_ack_takes_a_frame_only_when_decode_gives_that_ack_from_those_bytes(
        channel in 0u16..4,
        nack in any::<bool>(),
        delivery_tag in any::<u64>(),
        multiple in any::<bool>(),
        requeue in any::<bool>(),
        change in prop_oneof![
            Just(Change::None),
            (0usize..21, 1u8..=255).prop_map(|(at, mask)| Change::Flip(at, mask)),
            (0usize..21).prop_map(Change::Cut),
            Just(Change::AllBits),
        ],
        frame_max in prop_oneof![Just(0u32), Just(20), Just(21), Just(4096)],
        wanted in any::<bool>(),
        trailing in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let method: Method = if nack {
            BasicNack { delivery_tag, multiple, requeue }.into()
        } else {
            BasicAck { delivery_tag, multiple }.into()
        };
        let mut frame = BytesMut::new();
        encode_method(channel, &method, &mut frame).unwrap();
        prop_assert_eq!(frame.len(), 21);
        match change {
            Change::None => {}
            Change::Flip(at, mask) => frame[at] ^= mask,
            Change::Cut(len) => frame.truncate(len),
            Change::AllBits => frame[19] = 0xFF,
        }
        frame.put_slice(&trailing);
        let decoder = FrameDecoder::new(frame_max);

        let mut taken = frame.clone();
        let mut asked = None;
        let ack = decoder.take_ack(&mut taken, |ch| {
            asked = Some(ch);
            wanted
        });
        let (decoded, rest) = decoded_ack(&decoder, frame.clone());
        match ack {
            Some(ack) => {
                prop_assert!(wanted);
                prop_assert_eq!(Some(ack), decoded);
                prop_assert_eq!(&taken[..], &rest[..]);
            }
            None => {
                // Left as it was; refused only when decode would give an
                // ack or nack the caller did not want.
                prop_assert_eq!(&taken[..], &frame[..]);
                if asked.is_none() || wanted {
                    prop_assert_eq!(decoded, None);
                } else {
                    prop_assert_eq!(decoded.map(|d| d.channel), asked);
                }
            }
        }
    }
}
