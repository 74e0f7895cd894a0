//! Sampling clients (`SESSION:sample:N`): what each samples with and which client's process
//! serves it. A sampler on a training client's weights as they were (`save_weights_for_sampler`)
//! or on a state it saved is served by that training client's process with the saved adapter
//! swapped in for the call; any other (another session's path, the base model alone) gets a
//! process of its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// The most samplers kept; past it a session's oldest go first.
pub const MAX_SAMPLERS: usize = 100_000;

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
    /// Its number in the session, for the oldest-first bound.
    pub number: u64,
}

/// Every sampler.
#[derive(Default)]
pub struct Samplers {
    by_id: Mutex<HashMap<String, Sampler>>,
}

impl Samplers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sampler>> {
        self.by_id.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records sampler `id` (again: the same sampler, for a retried request).
    pub fn insert(&self, id: &str, sampler: Sampler) {
        let mut by_id = self.lock();
        if by_id.len() >= MAX_SAMPLERS
            && let Some(oldest) = by_id
                .iter()
                .filter(|(_, s)| s.session == sampler.session)
                .min_by_key(|(_, s)| s.number)
                .map(|(id, _)| id.clone())
        {
            by_id.remove(&oldest);
        }
        by_id.insert(id.to_owned(), sampler);
    }

    /// `team`'s sampler `id`.
    pub fn get(&self, id: &str, team: &str) -> Option<Sampler> {
        self.lock().get(id).filter(|sampler| sampler.team == team).cloned()
    }

    /// Forgets `team`'s session `session`'s samplers.
    pub fn close_session(&self, session: &str, team: &str) {
        self.lock().retain(|_, sampler| !(sampler.session == session && sampler.team == team));
    }
}
