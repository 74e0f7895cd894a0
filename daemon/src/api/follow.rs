//! One Redis reader per followed job or pipeline, fanned out to all of its event streams.
//!
//! Each `GET /v1/jobs/{id}/events` used to poll Redis itself (its events and the job's record,
//! 4 times a second): 500 streams on one job were 4,000 reads a second on the API's shared
//! connection, enough to starve every other team's requests. Now the first stream of an item
//! starts a [`Followed`] reader; later streams of the same item share what it read; the reader
//! ends when its last stream closes (or the daemon stops). A stream's own work is only the
//! filtering of events after its client's position.
//!
//! The reader reads the item's view first and its events second, in one pass: once a pass sees
//! the item ended, its events hold every event up to the final one (a state and its event are
//! written by one script), so a stream that has sent them all can end.
//!
//! The reader polls: a blocking `XREAD` would stall the shared multiplexed connection. What it
//! reads reaches the item's streams through a `watch` channel.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// How often a reader looks for new events and progress.
pub const EVERY: Duration = Duration::from_millis(250);

/// Where a followed item's events and view are read from.
pub trait Source: Clone + Send + Sync + 'static {
    type Event: Clone + PartialEq + Send + Sync + 'static;
    type View: Clone + PartialEq + Send + Sync + 'static;
    /// The item's view; `None` when it cannot be read now (the reader tries again).
    fn view(&self, id: &str) -> impl Future<Output = Option<Self::View>> + Send;
    /// Some of its events after stream id `after`, oldest first (empty: none left); `None` when
    /// they cannot be read now.
    fn events_after(&self, id: &str, after: &str) -> impl Future<Output = Option<Vec<Self::Event>>> + Send;
    /// An event's stream id (`<ms>-<seq>`).
    fn event_id(event: &Self::Event) -> &str;
}

/// What a reader has read of one item: every event so far, oldest first, and the view read just
/// before the last of them.
pub struct Seen<S: Source> {
    pub events: Arc<Vec<S::Event>>,
    pub view: Option<S::View>,
}

impl<S: Source> Seen<S> {
    /// The events after stream position `after` (a client's `Last-Event-ID`), oldest first.
    pub fn events_after(&self, after: &str) -> Vec<S::Event> {
        let after = stream_order(after);
        self.events.iter().filter(|event| stream_order(S::event_id(event)) > after).cloned().collect()
    }
}

/// What one stream receives: `None` until the reader's first pass.
pub type Seeing<S> = watch::Receiver<Option<Arc<Seen<S>>>>;

/// What a reader sends its streams.
type Reader<S> = watch::Sender<Option<Arc<Seen<S>>>>;

/// The readers of one kind of item, by id.
pub struct Readers<S: Source> {
    source: S,
    every: Duration,
    stopping: CancellationToken,
    readers: Mutex<HashMap<String, Reader<S>>>,
}

impl<S: Source> Readers<S> {
    /// Readers that read `source` every `every` while an item has a stream, until `stopping`.
    pub fn new(source: S, every: Duration, stopping: CancellationToken) -> Arc<Readers<S>> {
        Arc::new(Readers { source, every, stopping, readers: Mutex::default() })
    }

    /// What item `id`'s reader reads, starting one if it has none. Dropping the receiver is
    /// leaving: the last one to leave ends the reader.
    pub fn follow(self: &Arc<Self>, id: &str) -> Seeing<S> {
        let mut readers = self.readers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(reader) = readers.get(id) {
            return reader.subscribe();
        }
        let (reader, seeing) = watch::channel(None);
        readers.insert(id.to_owned(), reader.clone());
        let span = tracing::debug_span!("follow", item = %id);
        tokio::spawn(self.clone().read(id.to_owned(), reader).instrument(span));
        seeing
    }

    /// How many items have a reader now.
    pub fn reading(&self) -> usize {
        self.readers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// Reads item `id` until no stream follows it.
    async fn read(self: Arc<Self>, id: String, reader: Reader<S>) {
        let mut events: Arc<Vec<S::Event>> = Arc::default();
        let mut last = "0".to_owned();
        loop {
            if let Some(view) = self.source.view(&id).await {
                let mut fresh = Vec::new();
                let complete = loop {
                    match self.source.events_after(&id, &last).await {
                        Some(batch) if batch.is_empty() => break true,
                        Some(batch) => {
                            last = S::event_id(batch.last().expect("not empty")).to_owned();
                            fresh.extend(batch);
                        }
                        None => break false,
                    }
                };
                if !fresh.is_empty() {
                    let mut all = Vec::clone(&events);
                    all.extend(fresh);
                    events = Arc::new(all);
                }
                // A view is only worth sending with every event written before it: an ended
                // view ends the streams that have sent the events they hold.
                if complete {
                    let seen = Seen { events: events.clone(), view: Some(view) };
                    reader.send_if_modified(|now| {
                        let changed = now
                            .as_ref()
                            .is_none_or(|now| now.events.len() != seen.events.len() || now.view != seen.view);
                        if changed {
                            *now = Some(Arc::new(seen));
                        }
                        changed
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.every) => {}
                _ = reader.closed() => {}
                _ = self.stopping.cancelled() => {}
            }
            let mut readers = self.readers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Under the lock `follow` takes: no stream can join between the count and the removal.
            if reader.receiver_count() == 0 || self.stopping.is_cancelled() {
                readers.remove(&id);
                return;
            }
        }
    }
}

/// A stream id's place in its stream: `<ms>-<seq>`, or `<ms>` for `<ms>-0`, as Redis orders them;
/// anything else (checked away before a stream starts) sorts first.
fn stream_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

/// Until the reader sends something new; `false` when the stream should end (the daemon stops).
/// Stopping is looked at first: a stream with a change it has not seen yet still ends at once.
pub async fn changed<S: Source>(seeing: &mut Seeing<S>, stopping: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = stopping.cancelled() => false,
        changed = seeing.changed() => changed.is_ok(),
    }
}

impl Source for rlvr_queue::store::JobStore {
    type Event = rlvr_protocol::job::JobEvent;
    type View = rlvr_protocol::job::JobView;

    async fn view(&self, id: &str) -> Option<Self::View> {
        self.get(id).await.ok()
    }

    async fn events_after(&self, id: &str, after: &str) -> Option<Vec<Self::Event>> {
        self.events(id, after).await.ok()
    }

    fn event_id(event: &Self::Event) -> &str {
        &event.id
    }
}

impl Source for rlvr_queue::pipelines::PipelineStore {
    type Event = rlvr_protocol::pipeline::PipelineEvent;
    type View = rlvr_protocol::pipeline::PipelineView;

    async fn view(&self, id: &str) -> Option<Self::View> {
        self.get(id).await.ok()
    }

    async fn events_after(&self, id: &str, after: &str) -> Option<Vec<Self::Event>> {
        self.events(id, after).await.ok()
    }

    fn event_id(event: &Self::Event) -> &str {
        &event.id
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An item whose view is a number and whose events are `("<n>-0", n)`, counting the reads.
    #[derive(Clone, Default)]
    struct Counted {
        events: Arc<Mutex<Vec<(String, u32)>>>,
        views: Arc<AtomicUsize>,
        event_reads: Arc<AtomicUsize>,
    }

    impl Source for Counted {
        type Event = (String, u32);
        type View = usize;

        async fn view(&self, _: &str) -> Option<usize> {
            Some(self.views.fetch_add(1, Ordering::SeqCst))
        }

        async fn events_after(&self, _: &str, after: &str) -> Option<Vec<(String, u32)>> {
            self.event_reads.fetch_add(1, Ordering::SeqCst);
            let after = stream_order(after);
            let events = self.events.lock().unwrap();
            // Two at a time, as a store answers at most a batch.
            Some(events.iter().filter(|(id, _)| stream_order(id) > after).take(2).cloned().collect())
        }

        fn event_id(event: &(String, u32)) -> &str {
            &event.0
        }
    }

    #[test]
    fn stream_ids_sort_as_redis_sorts_them() {
        let sorted = ["0", "1-0", "1-1", "2", "2-3", "10-0", "18446744073709551615-18446744073709551615"];
        for pair in sorted.windows(2) {
            assert!(stream_order(pair[0]) < stream_order(pair[1]), "{pair:?}");
        }
        assert_eq!(stream_order("5"), stream_order("5-0"));
    }

    #[tokio::test]
    async fn many_streams_of_one_item_share_one_reader_which_ends_with_the_last_stream() {
        let source = Counted::default();
        source.events.lock().unwrap().extend((1..=5).map(|n| (format!("{n}-0"), n)));
        let stopping = CancellationToken::new();
        let every = Duration::from_millis(50);
        let readers = Readers::new(source.clone(), every, stopping.clone());
        let mut streams: Vec<_> = (0..50).map(|_| readers.follow("job")).collect();
        let mut other = readers.follow("other");
        assert_eq!(readers.reading(), 2);
        for seeing in streams.iter_mut() {
            assert!(changed(seeing, &stopping).await);
        }
        let seen = streams[0].borrow().clone().expect("read once");
        // Every event, though the store answers two at a time.
        assert_eq!(seen.events.iter().map(|e| e.1).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert_eq!(seen.events_after("3-0").iter().map(|e| e.1).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(seen.events_after("3").iter().map(|e| e.1).collect::<Vec<_>>(), [4, 5]);
        assert!(seen.events_after("99999999999999").is_empty());

        // 51 streams, two readers: one read of the view per reader and pass, at most a pass per
        // `every` (fewer on a loaded machine), where a read per stream would be 51 a pass.
        let (views, started) = (source.views.load(Ordering::SeqCst), std::time::Instant::now());
        tokio::time::sleep(every * 10).await;
        let passes = (started.elapsed().as_millis() / every.as_millis()) as usize + 1;
        let views = source.views.load(Ordering::SeqCst) - views;
        assert!(views <= 2 * passes, "{views} view reads in {passes} passes");
        // A new event reaches every stream of the item, read once.
        let reads = source.event_reads.load(Ordering::SeqCst);
        source.events.lock().unwrap().push(("6-0".to_owned(), 6));
        for seeing in streams.iter_mut() {
            let sixth = async {
                while seeing.borrow_and_update().as_ref().unwrap().events.last().map(|e| e.1) != Some(6) {
                    assert!(changed(seeing, &stopping).await);
                }
            };
            tokio::time::timeout(Duration::from_secs(30), sixth).await.expect("the sixth event");
        }
        assert!(source.event_reads.load(Ordering::SeqCst) - reads <= 6);

        // The last stream of "job" leaving ends its reader; "other" reads on.
        streams.truncate(1);
        tokio::time::sleep(every * 3).await;
        assert_eq!(readers.reading(), 2);
        streams.clear();
        let ended = async {
            while readers.reading() != 1 {
                tokio::time::sleep(every).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), ended).await.expect("the reader ends");
        // A stream that comes back starts a new reader, which reads everything again.
        let mut again = readers.follow("job");
        assert!(changed(&mut again, &stopping).await);
        assert_eq!(again.borrow().as_ref().unwrap().events.len(), 6);
        // The daemon stopping ends the streams and the readers.
        stopping.cancel();
        assert!(!changed(&mut other, &stopping).await);
        let ended = async {
            while readers.reading() != 0 {
                tokio::time::sleep(every).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), ended).await.expect("the readers end");
    }
}
