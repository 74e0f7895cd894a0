//! Slots shared fairly by teams: when a slot frees, it goes to the waiting team with the fewest
//! slots held, the earliest waiter first among equals, so one team's many requests do not line up
//! in front of another's one. The registry's options checks in worker processes take these
//! (`Registry::check_options`), two at a time over the daemon.
//!
//! [`next_waiter`] is the rule; [`FairSlots`] keeps the state behind a mutex and a condvar.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};

/// Who holds and who waits for the slots.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Queue {
    free: usize,
    held_by: HashMap<String, usize>,
    /// `(ticket, team)`, in arrival order.
    waiting: VecDeque<(u64, String)>,
    next_ticket: u64,
}

/// The ticket of the waiter that takes the next free slot; `None` while no slot is free or no one
/// waits.
pub fn next_waiter(queue: &Queue) -> Option<u64> {
    if queue.free == 0 {
        return None;
    }
    queue
        .waiting
        .iter()
        .enumerate()
        .min_by_key(|(position, (_, team))| (queue.held_by.get(team).copied().unwrap_or(0), *position))
        .map(|(_, (ticket, _))| *ticket)
}

/// `slots` slots, given out by [`next_waiter`].
#[derive(Debug)]
pub struct FairSlots {
    queue: Mutex<Queue>,
    freed: Condvar,
}

/// A slot held by `team`, given back when dropped.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a FairSlots,
    team: String,
}

impl FairSlots {
    pub fn new(slots: usize) -> Self {
        FairSlots {
            queue: Mutex::new(Queue { free: slots.max(1), ..Queue::default() }),
            freed: Condvar::new(),
        }
    }

    /// Waits for `team`'s turn at a slot.
    pub fn take(&self, team: &str) -> Slot<'_> {
        let mut queue = self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push_back((ticket, team.to_owned()));
        while next_waiter(&queue) != Some(ticket) {
            queue = self.freed.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        queue.waiting.retain(|(waiting, _)| *waiting != ticket);
        queue.free -= 1;
        *queue.held_by.entry(team.to_owned()).or_default() += 1;
        // Another slot may be free for the next waiter.
        self.freed.notify_all();
        Slot { slots: self, team: team.to_owned() }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut queue = self.slots.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        queue.free += 1;
        if let Some(held) = queue.held_by.get_mut(&self.team) {
            *held -= 1;
            if *held == 0 {
                queue.held_by.remove(&self.team);
            }
        }
        drop(queue);
        // Every waiter looks again: the rule, not arrival, says whose turn it is.
        self.slots.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(free: usize, held: &[(&str, usize)], waiting: &[&str]) -> Queue {
        Queue {
            free,
            held_by: held.iter().map(|(team, count)| ((*team).to_owned(), *count)).collect(),
            waiting: waiting.iter().enumerate().map(|(i, team)| (i as u64, (*team).to_owned())).collect(),
            next_ticket: waiting.len() as u64,
        }
    }

    #[test]
    fn a_free_slot_goes_to_the_team_holding_fewest_then_to_the_earliest() {
        // (free, held, waiting in arrival order, the ticket that runs next)
        type Held<'a> = &'a [(&'a str, usize)];
        let cases: &[(usize, Held<'_>, &[&str], Option<u64>)] = &[
            (1, &[], &["a", "a", "b"], Some(0)),
            // Team a holds one: b's single request goes before a's ten.
            (1, &[("a", 1)], &["a", "a", "a", "a", "a", "a", "a", "a", "a", "a", "b"], Some(10)),
            (1, &[("a", 1), ("b", 1)], &["b", "a"], Some(0)),
            (1, &[("a", 2)], &["a", "c", "b"], Some(1)),
            (0, &[("a", 2)], &["b"], None),
            (1, &[], &[], None),
        ];
        for (free, held, waiting, want) in cases {
            assert_eq!(next_waiter(&queue(*free, held, waiting)), *want, "{held:?} {waiting:?}");
        }
    }

    #[test]
    fn slots_are_given_back_and_a_waiting_team_is_served() {
        let slots = FairSlots::new(1);
        let held = slots.take("a");
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| drop(slots.take("b")));
            while slots.queue.lock().unwrap().waiting.is_empty() {
                std::thread::yield_now();
            }
            drop(held);
            waiter.join().unwrap();
        });
        let queue = slots.queue.lock().unwrap();
        assert_eq!((queue.free, queue.held_by.len(), queue.waiting.len()), (1, 0, 0));
    }
}
