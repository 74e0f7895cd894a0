//! The bytes of an event file (**pure**): TFRecord framing of `Event` protos.
//!
//! A record is `u64` length (little-endian), the masked CRC-32C of those 8 bytes, the bytes, and
//! their masked CRC-32C; the mask (`((crc >> 15) | (crc << 17)) + 0xa282ead8`) is TensorFlow's,
//! so that a CRC over data that itself holds CRCs stays meaningful. The messages are `prost`
//! derives of exactly the fields written, numbered as `event.proto` and `summary.proto` number
//! them: a derive is checked by the compiler and costs two small crates, where a hand-written
//! encoder would be one more thing to get right; no `protoc` or build script is needed.

use crate::scalars::Scalar;

/// The version every event file declares first; `brain.Event:2` is what tells TensorBoard's
/// loader to honour `SessionLog` START (purging the steps a restarted run writes again).
pub const FILE_VERSION: &str = "brain.Event:2";

/// TensorFlow's mask of a CRC-32C stored next to the data it covers.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// `payload` as one TFRecord, appended to `out`.
pub fn frame_into(payload: &[u8], out: &mut Vec<u8>) {
    let length = (payload.len() as u64).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
}

/// `event` encoded and framed: the bytes one record adds to a file.
pub fn record(event: &Event) -> Vec<u8> {
    let payload = prost::Message::encode_to_vec(event);
    let mut out = Vec::with_capacity(payload.len() + 16);
    frame_into(&payload, &mut out);
    out
}

/// `tensorflow.Event`: when, at which step, and what.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

/// `Event.what`, the variants written.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// `tensorflow.Summary`: the values of one event.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`, a scalar (`simple_value`: TensorBoard's scalars are `float`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A member of the proto's `oneof value`, so written even when 0: a plain proto3 `float`
    /// would leave a zero out, and TensorBoard would see a value that is not a scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `tensorflow.SessionLog`: only its status is written.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    #[prost(enumeration = "SessionStatus", tag = "1")]
    pub status: i32,
}

/// `tensorflow.SessionLog.SessionStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum SessionStatus {
    Unspecified = 0,
    /// A (re)start: readers drop every event they hold at this step or later.
    Start = 1,
    Stop = 2,
    Checkpoint = 3,
}

impl Event {
    /// The first event of every file.
    pub fn file_version(wall_time: f64) -> Event {
        Event { wall_time, step: 0, what: Some(What::FileVersion(FILE_VERSION.to_owned())) }
    }

    /// A run (re)starting at `step`: what an earlier process wrote from `step` on is stale.
    pub fn start(wall_time: f64, step: u64) -> Event {
        let log = SessionLog { status: SessionStatus::Start as i32 };
        Event { wall_time, step: step_i64(step), what: Some(What::SessionLog(log)) }
    }

    /// `scalars` at `step`, in one summary.
    pub fn scalars(wall_time: f64, step: u64, scalars: &[Scalar]) -> Event {
        let value = scalars
            .iter()
            // TensorBoard's scalars are 32-bit; the JSON log keeps the full value.
            .map(|scalar| SummaryValue { tag: scalar.tag.clone(), simple_value: Some(scalar.value as f32) })
            .collect();
        Event { wall_time, step: step_i64(step), what: Some(What::Summary(Summary { value })) }
    }
}

/// Steps are `int64` in the proto; no run reaches 2^63 steps, so the cap never bites.
fn step_i64(step: u64) -> i64 {
    i64::try_from(step).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_crc(input: &[u8], crc: u32, masked: u32) {
        assert_eq!(crc32c::crc32c(input), crc, "crc32c of {input:?}");
        assert_eq!(masked_crc32c(input), masked, "masked crc32c of {input:?}");
    }

    #[test]
    fn crc32c_and_its_mask() {
        // The CRC-32C check value (RFC 3720 §B.4, and every CRC catalogue): "123456789".
        // The masked values are TensorBoard's own `masked_crc32c` (its pure-Python
        // `compat/tensorflow_stub/pywrap_tensorflow.py`) on the same input.
        check_crc(b"123456789", 0xe306_9283, 0xc78a_b0e5);
        check_crc(b"", 0, 0xa282_ead8);
        // 32 zero bytes: RFC 3720 §B.4's first vector.
        check_crc(&[0u8; 32], 0x8a91_36aa, 0x0fd7_fffa);
    }

    fn check_record(event: Event, expected_hex: &str) {
        let bytes = record(&event);
        assert_eq!(hex(&bytes), expected_hex, "{event:?}");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    // The expected records are TensorBoard's: `event_pb2.Event(...).SerializeToString()` framed by
    // `tensorboard.summary.writer.record_writer.RecordWriter` (TensorBoard 2.21.0), for the same
    // events. Laid out as: length, its masked CRC, the proto, its masked CRC.
    #[test]
    fn records_equal_tensorboards_own() {
        check_record(Event::file_version(1.5), GOLDEN_FILE_VERSION);
        check_record(Event::start(2.0, 7), GOLDEN_START);
        let scalars = [
            Scalar { tag: "train/loss".to_owned(), value: 0.25 },
            Scalar { tag: "heldout/accuracy".to_owned(), value: 0.1 },
            // regression: a zero was left out (proto3's default), and TensorBoard dropped the value.
            Scalar { tag: "train/kl_ref".to_owned(), value: 0.0 },
        ];
        check_record(Event::scalars(1_700_000_000.5, 3, &scalars), GOLDEN_SCALARS);
    }

    const GOLDEN_FILE_VERSION: &str = concat!(
        "1800000000000000", // 24 bytes
        "a37f4b22",
        "09000000000000f83f",             // 1: wall_time 1.5 (double)
        "1a0d627261696e2e4576656e743a32", // 3: file_version "brain.Event:2"
        "2a28646c",
    );
    const GOLDEN_START: &str = concat!(
        "0f00000000000000", // 15 bytes
        "6d532b09",
        "090000000000000040", // 1: wall_time 2.0
        "1007",               // 2: step 7
        "3a020801",           // 7: session_log { status: START }
        "d1715dcb",
    );
    const GOLDEN_SCALARS: &str = concat!(
        "4e00000000000000", // 78 bytes
        "c4b905ad",
        "0900002040fc54d941",                   // 1: wall_time 1700000000.5
        "1003",                                 // 2: step 3
        "2a41",                                 // 5: summary, 65 bytes
        "0a11",                                 // value 1, 17 bytes
        "0a0a747261696e2f6c6f7373",             // tag "train/loss"
        "150000803e",                           // simple_value 0.25f
        "0a17",                                 // value 2, 23 bytes
        "0a1068656c646f75742f6163637572616379", // tag "heldout/accuracy"
        "15cdcccc3d",                           // simple_value 0.1f
        "0a13",                                 // value 3, 19 bytes
        "0a0c747261696e2f6b6c5f726566",         // tag "train/kl_ref"
        "1500000000",                           // simple_value 0.0f, present
        "77977a19",
    );
}
