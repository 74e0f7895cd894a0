//! A training client's requests in `seq_id` order (pure): what the SDK sends may arrive out of
//! order (chunks of one forward/backward, the first sent last) and more than once (the SDK retries
//! a POST on 408, 409, 429 and 5xx with the same `seq_id` and a fresh idempotency key). Each
//! request is run once, in order; a retry gets the request id of the first arrival.
//!
//! The SDK numbers a client's requests 1, 2, 3, … (`seq_id = request index + 1`); the client
//! expects the first at [`SeqOrder::new`]'s `first`. A gap waits for its request; a `seq_id`
//! already used by a *different* request (another body) is the request's fault, refused with a
//! sentence; one far past the next expected (more than [`MAX_AHEAD`]) too, so a client cannot make
//! the daemon hold unbounded requests.

use std::collections::{BTreeMap, HashMap};

/// How far past the next expected `seq_id` a request may arrive and be held. The SDK sends a
/// client's requests one after another (chunks in parallel only where `client/config` says so,
/// which rlvr does not), so a gap is a retry's; each held request keeps its body.
pub const MAX_AHEAD: u64 = 64;

/// How many run requests' ids are remembered for their retries.
const REMEMBERED: usize = 1024;

/// What arrived: the request's id, which the SDK polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// New: held until its turn, under this id.
    New(String),
    /// A retry of a request that already arrived: the first arrival's id.
    Again(String),
}

/// Why a request cannot be taken (the request's fault: a `user` error to the SDK).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("seq_id {seq} was already used by another request of this client")]
    Reused { seq: u64 },
    #[error(
        "seq_id {seq} is {ahead} past the next this client expects ({next}); at most {MAX_AHEAD} may wait"
    )]
    TooFarAhead { seq: u64, next: u64, ahead: u64 },
    #[error("seq_id {seq} is older than any this client remembers (the next expected is {next})")]
    Forgotten { seq: u64, next: u64 },
}

/// A request waiting for its turn: its id, what identifies its body, and the operation.
#[derive(Debug)]
struct Held<T> {
    id: String,
    fingerprint: [u8; 32],
    op: T,
}

/// One client's requests, in order.
#[derive(Debug)]
pub struct SeqOrder<T> {
    next: u64,
    held: BTreeMap<u64, Held<T>>,
    /// Requests released to run, by `seq_id`: their ids and fingerprints, for retries.
    released: HashMap<u64, (String, [u8; 32])>,
}

impl<T> SeqOrder<T> {
    /// A client whose first request is `first` (1 for a fresh one; the next after a restored
    /// state's last).
    pub fn new(first: u64) -> Self {
        SeqOrder { next: first, held: BTreeMap::new(), released: HashMap::new() }
    }

    /// The next `seq_id` to run.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Takes request `seq` (its body's `fingerprint`); `new_id` makes the id of a new request, and
    /// `op` its operation from that id (neither is called for a retry).
    pub fn arrive(
        &mut self,
        seq: u64,
        fingerprint: [u8; 32],
        new_id: impl FnOnce() -> String,
        op: impl FnOnce(&str) -> T,
    ) -> Result<Arrival, OrderError> {
        let again = |id: &String, seen: &[u8; 32]| {
            if *seen == fingerprint {
                Ok(Arrival::Again(id.clone()))
            } else {
                Err(OrderError::Reused { seq })
            }
        };
        if let Some((id, seen)) = self.released.get(&seq) {
            return again(id, seen);
        }
        if let Some(held) = self.held.get(&seq) {
            return again(&held.id, &held.fingerprint);
        }
        if seq < self.next {
            return Err(OrderError::Forgotten { seq, next: self.next });
        }
        if seq - self.next > MAX_AHEAD {
            return Err(OrderError::TooFarAhead { seq, next: self.next, ahead: seq - self.next });
        }
        let id = new_id();
        let op = op(&id);
        self.held.insert(seq, Held { id: id.clone(), fingerprint, op });
        Ok(Arrival::New(id))
    }

    /// The requests whose turn has come, in order, each with its `seq_id` and id: every held one
    /// from the next expected on, up to the first gap.
    pub fn ready(&mut self) -> Vec<(u64, String, T)> {
        let mut out = Vec::new();
        while let Some(held) = self.held.remove(&self.next) {
            self.released.insert(self.next, (held.id.clone(), held.fingerprint));
            out.push((self.next, held.id, held.op));
            self.next += 1;
        }
        if self.released.len() > REMEMBERED {
            let oldest_kept = self.next.saturating_sub(REMEMBERED as u64);
            self.released.retain(|seq, _| *seq >= oldest_kept);
        }
        out
    }

    /// Drops held request `seq` (one that could not be taken after all); its retry may come again.
    pub fn forget(&mut self, seq: u64) -> bool {
        self.held.remove(&seq).is_some()
    }

    /// Every request still waiting for an earlier one, taken out (its client is closing).
    pub fn take_held(&mut self) -> Vec<(String, T)> {
        std::mem::take(&mut self.held).into_values().map(|held| (held.id, held.op)).collect()
    }

    /// Requests waiting for an earlier one.
    pub fn waiting(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    /// Runs arrivals `(seq, body)` in turn; returns what each answered and the order run in.
    fn run(arrivals: &[(u64, [u8; 32])]) -> (Vec<Result<Arrival, OrderError>>, Vec<u64>) {
        let mut order = SeqOrder::new(1);
        let mut made = 0;
        let mut answers = Vec::new();
        let mut ran = Vec::new();
        for (seq, body) in arrivals {
            let seq = *seq;
            answers.push(order.arrive(
                seq,
                *body,
                || {
                    made += 1;
                    format!("r{made}")
                },
                |_| seq,
            ));
            ran.extend(order.ready().into_iter().map(|(seq, _, op)| {
                assert_eq!(seq, op);
                op
            }));
        }
        (answers, ran)
    }

    #[test]
    fn requests_run_once_each_in_seq_order_whatever_order_they_arrive_in() {
        use Arrival::{Again, New};
        let new = |id: &str| Ok(New(id.to_owned()));
        let again = |id: &str| Ok(Again(id.to_owned()));
        // (arrivals, answers, the order run in)
        type Case = (Vec<(u64, [u8; 32])>, Vec<Result<Arrival, OrderError>>, Vec<u64>);
        let cases: Vec<Case> = vec![
            // In order.
            (vec![(1, A), (2, A)], vec![new("r1"), new("r2")], vec![1, 2]),
            // The SDK's chunks: 2 and 3 first, 1 last; then the optim_step, 4.
            (
                vec![(2, A), (3, A), (1, A), (4, A)],
                vec![new("r1"), new("r2"), new("r3"), new("r4")],
                vec![1, 2, 3, 4],
            ),
            // A retry while held, and after it ran: the first arrival's id, run once.
            (
                vec![(2, A), (2, A), (1, A), (2, A), (1, A)],
                vec![new("r1"), again("r1"), new("r2"), again("r1"), again("r2")],
                vec![1, 2],
            ),
            // The same seq_id with another body.
            (vec![(1, A), (1, B)], vec![new("r1"), Err(OrderError::Reused { seq: 1 })], vec![1]),
            (vec![(2, A), (2, B)], vec![new("r1"), Err(OrderError::Reused { seq: 2 })], vec![]),
            // Too far ahead, and before the first.
            (
                vec![(MAX_AHEAD + 2, A), (MAX_AHEAD + 1, A)],
                vec![
                    Err(OrderError::TooFarAhead { seq: MAX_AHEAD + 2, next: 1, ahead: MAX_AHEAD + 1 }),
                    new("r1"),
                ],
                vec![],
            ),
            (vec![(0, A)], vec![Err(OrderError::Forgotten { seq: 0, next: 1 })], vec![]),
        ];
        for (arrivals, answers, ran) in cases {
            assert_eq!(run(&arrivals), (answers, ran), "{arrivals:?}");
        }
    }

    #[test]
    fn a_restored_client_starts_at_its_next_request_and_forgets_only_long_past_ones() {
        let mut order: SeqOrder<()> = SeqOrder::new(41);
        assert_eq!(
            order.arrive(40, A, || "x".into(), |_| ()),
            Err(OrderError::Forgotten { seq: 40, next: 41 })
        );
        for seq in 41..41 + REMEMBERED as u64 + 10 {
            assert!(matches!(order.arrive(seq, A, || format!("r{seq}"), |_| ()), Ok(Arrival::New(_))));
            assert_eq!(order.ready().len(), 1);
        }
        assert_eq!(order.waiting(), 0);
        let last = 41 + REMEMBERED as u64 + 9;
        assert_eq!(order.arrive(last, A, || unreachable!(), |_| ()), Ok(Arrival::Again(format!("r{last}"))));
        assert!(matches!(order.arrive(41, A, || unreachable!(), |_| ()), Err(OrderError::Forgotten { .. })));
        // A closing client's held requests are taken out, each with its id.
        assert!(matches!(order.arrive(last + 3, A, || "held".into(), |_| ()), Ok(Arrival::New(_))));
        assert_eq!(order.take_held(), vec![("held".to_owned(), ())]);
        assert_eq!(order.waiting(), 0);
    }
}
