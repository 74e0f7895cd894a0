//! Sampling clients (`SESSION:sample:N`): what each samples with and which client's process
//! serves it. A sampler on a training client's weights as they were (`save_weights_for_sampler`)
//! or on a state it saved is served by that training client's process with the saved adapter
//! swapped in for the call; any other (another session's path, the base model alone) gets a
//! process of its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The snapshots (`save_weights_and_get_sampling_client`) a training client keeps on disk: the
/// newest; an older one's sampler is gone (each is an adapter's worth of disk, one a step).
pub const KEPT_SNAPSHOTS: u64 = 8;

/// The most samplers one team keeps; past it the team's oldest go first (another team's are
/// not touched).
pub const MAX_SAMPLERS: usize = 10_000;

/// A sampling client.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    pub team: String,
    pub session: String,
    /// The base model as the SDK names it.
    pub base_name: String,
    /// The `tinker://` path it was made from, if any.
    pub model_path: Option<String>,
    /// The client whose process samples for it.
    pub served_by: String,
    /// The adapter directory swapped in for its samples; `None`: the serving client's own.
    pub weights: Option<PathBuf>,
    /// Its number in the session.
    pub number: u64,
}

/// Every sampler, each with its place in the order they were made.
pub struct Samplers {
    by_id: Mutex<HashMap<String, (u64, Sampler)>>,
    made: std::sync::atomic::AtomicU64,
    /// [`MAX_SAMPLERS`] a team, but in tests.
    cap: usize,
}

impl Default for Samplers {
    fn default() -> Self {
        Samplers { by_id: Mutex::default(), made: Default::default(), cap: MAX_SAMPLERS }
    }
}

impl Samplers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Sampler)>> {
        self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records sampler `id` (again: the same sampler, for a retried request). Past the team's
    /// [`MAX_SAMPLERS`] its oldest goes (its session's clients may be long gone).
    pub fn insert(&self, id: &str, sampler: Sampler) {
        let made = self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut by_id = self.lock();
        if !by_id.contains_key(id) {
            let of_team = by_id.values().filter(|(_, kept)| kept.team == sampler.team);
            if of_team.clone().count() >= self.cap
                && let Some(oldest) = by_id
                    .iter()
                    .filter(|(_, (_, kept))| kept.team == sampler.team)
                    .min_by_key(|(_, (made, _))| *made)
                    .map(|(id, _)| id.clone())
            {
                by_id.remove(&oldest);
            }
        }
        by_id.insert(id.to_owned(), (made, sampler));
    }

    /// `team`'s sampler `id`.
    pub fn get(&self, id: &str, team: &str) -> Option<Sampler> {
        self.lock().get(id).map(|(_, sampler)| sampler).filter(|sampler| sampler.team == team).cloned()
    }

    /// Forgets sampler `id`.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Forgets `team`'s session `session`'s samplers.
    pub fn close_session(&self, session: &str, team: &str) {
        self.lock().retain(|_, (_, sampler)| !(sampler.session == session && sampler.team == team));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(team: &str, session: &str) -> Sampler {
        Sampler {
            team: team.into(),
            session: session.into(),
            base_name: "builtin:tiny-arith".into(),
            model_path: None,
            served_by: format!("{session}:train:0"),
            weights: None,
            number: 0,
        }
    }

    #[test]
    fn samplers_are_their_teams_bounded_oldest_first_and_go_with_their_session() {
        let samplers = Samplers { cap: 2, ..Samplers::default() };
        samplers.insert("a:sample:0", sampler("math", "a"));
        samplers.insert("b:sample:0", sampler("vision", "b"));
        samplers.insert("a:sample:1", sampler("math", "a"));
        assert!(samplers.get("a:sample:0", "math").is_some());
        assert_eq!(samplers.get("a:sample:0", "vision"), None, "another team's key finds none");
        // A retried insert replaces its own entry; a new one past the team's cap drops the team's
        // oldest, never another team's.
        samplers.insert("a:sample:1", sampler("math", "a"));
        samplers.insert("c:sample:0", sampler("math", "c"));
        assert_eq!(samplers.get("a:sample:0", "math"), None);
        assert!(samplers.get("a:sample:1", "math").is_some() && samplers.get("c:sample:0", "math").is_some());
        assert!(samplers.get("b:sample:0", "vision").is_some());
        samplers.close_session("c", "vision");
        assert!(samplers.get("c:sample:0", "math").is_some(), "only the session's own team closes it");
        samplers.close_session("c", "math");
        assert_eq!(samplers.get("c:sample:0", "math"), None);
    }
}
