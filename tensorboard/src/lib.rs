//! TensorBoard event files of a run's metrics: every `metrics.jsonl` line also as one event of
//! scalars, so a team points `tensorboard --logdir` at the jobs directory and watches its runs.
//!
//! Three parts, from the bytes up:
//! - [`record`] (**pure**): the TFRecord framing (length, masked CRC-32C, bytes, masked CRC-32C)
//!   and the `Event` protos TensorBoard reads (`prost` derives of the few fields written).
//! - [`scalars`] (**pure**): a `MetricsLine` as tagged scalars, by one rule over its JSON, so a
//!   field added to the line shows up in TensorBoard without a change here.
//! - [`writer`]: [`EventLog`], the appending file writer (one new file per process, flushed after
//!   every line; its first event after the version is a `SessionLog` START at the first step the
//!   process writes, so TensorBoard drops what a resumed run writes again).
//!
//! The format is TensorFlow's own (`tensorflow/core/util/event.proto`, `summary.proto`;
//! `tensorflow/core/lib/io/record_writer.cc`): the files are read by TensorBoard's loaders as
//! they are, no plugin needed.
//!
//! The worker's `drive::Loop::append_metrics` is the one caller: every line goes to
//! `metrics.jsonl`, then here; a failed write is logged and ends this process's events, never the
//! job. The event files are derived from `metrics.jsonl` and nothing reads them back:
//! `metrics.jsonl` stays the record.

pub mod record;
pub mod scalars;
pub mod writer;

pub use scalars::{Scalar, scalars};
pub use writer::{EventLog, EventLogError};
