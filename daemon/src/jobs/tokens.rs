//! Tokens the daemon makes for the runs of engine jobs: the engine grades its completions with
//! its job's graders, as its team, through `POST /v1/verify` and nothing else (`api::auth` lets a
//! job's token reach that route only). Each lives as long as its run's [`JobToken`]; held in
//! memory only (a restarted daemon mints new ones for the runs it starts), by hash, like the
//! config's tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// The job a job's token was minted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenJob {
    /// The job's team: the token acts as it.
    pub team: String,
    pub id: String,
    /// The engine's ranks, each of which may grade at once (`api::lanes`).
    pub ranks: usize,
}

/// The tokens of the runs going on now.
#[derive(Default)]
pub struct JobTokens {
    by_hash: Mutex<HashMap<[u8; 32], TokenJob>>,
}

/// A job's token, valid until dropped.
pub struct JobToken {
    /// The token, for the worker's environment only.
    pub token: String,
    hash: [u8; 32],
    tokens: Arc<JobTokens>,
}

impl JobTokens {
    /// A fresh token for a run of `job` of `team` on `ranks` engine processes. Errors: the OS has
    /// no randomness.
    pub fn mint(self: &Arc<Self>, team: &str, job: &str, ranks: usize) -> Result<JobToken, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        let token = format!("rlvr_job_{}", hex::encode(bytes));
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let job = TokenJob { team: team.to_owned(), id: job.to_owned(), ranks };
        self.by_hash.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(hash, job);
        Ok(JobToken { token, hash, tokens: self.clone() })
    }

    /// The job of the token whose SHA-256 is `hash`, while its run lasts.
    pub fn get(&self, hash: &[u8; 32]) -> Option<TokenJob> {
        self.by_hash.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(hash).cloned()
    }
}

impl Drop for JobToken {
    fn drop(&mut self) {
        self.tokens.by_hash.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.hash);
    }
}
