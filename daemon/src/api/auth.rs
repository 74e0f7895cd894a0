//! Bearer tokens and per-team rate limits of the job routes.
//!
//! The config holds only each token's SHA-256 (`[[auth.tokens]]`); a request's token is hashed
//! and looked up, so the daemon never holds a token and never logs one. Rate limits are per team,
//! so one team's runaway script cannot starve another's tools.

use std::collections::HashMap;
use std::num::NonZeroU32;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};

use crate::config::AuthConfig;

/// A fresh token: `rlvr_` and 32 random bytes in hex, from the OS's CSPRNG.
pub struct NewToken {
    /// The token, shown once to whoever hands it to the team.
    pub token: String,
    /// The `[[auth.tokens]]` entry to paste into the config: its sha256, never the token.
    pub entry: String,
}

/// Makes a token for `team` (an admin token when `admin`). Errors: the OS has no randomness.
pub fn new_token(team: &str, admin: bool) -> Result<NewToken, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let token = format!("rlvr_{}", hex::encode(bytes));
    let sha256 = hex::encode(Sha256::digest(token.as_bytes()));
    let entry = format!("[[auth.tokens]]\nteam = \"{team}\"\nsha256 = \"{sha256}\"\nadmin = {admin}\n");
    Ok(NewToken { token, entry })
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's team.
    pub team: String,
    /// Admin tokens see and cancel every team's jobs.
    pub admin: bool,
}

impl Caller {
    /// Whether this caller may see and cancel a job of `team`.
    pub fn may_act_for(&self, team: &str) -> bool {
        self.admin || self.team == team
    }
}

/// Why a request was refused before its handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// A header that is not `Bearer <token>`.
    Malformed,
    /// A token not in the config.
    Unknown,
    /// Over the team's rate limit; retry after this many seconds.
    RateLimited { retry_after_s: u64 },
}

/// The configured tokens and the per-team limiter.
pub struct Auth {
    by_hash: HashMap<[u8; 32], Caller>,
    limiter: DefaultKeyedRateLimiter<String>,
}

impl Auth {
    /// From `[auth]` (hashes already checked by the config loader) and the per-minute limit.
    pub fn new(config: &AuthConfig, per_minute: u32) -> Self {
        let by_hash = config
            .tokens
            .iter()
            .filter_map(|token| {
                let bytes: [u8; 32] = hex::decode(&token.sha256).ok()?.try_into().ok()?;
                Some((bytes, Caller { team: token.team.clone(), admin: token.admin }))
            })
            .collect();
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        // The whole minute's allowance may come at once (a bulk submit), then it refills evenly.
        let quota = Quota::per_minute(per_minute).allow_burst(per_minute);
        Auth { by_hash, limiter: RateLimiter::keyed(quota) }
    }

    /// The caller of a request, within its team's rate limit.
    pub fn check(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let value = headers.get(AUTHORIZATION).ok_or(AuthError::Missing)?;
        let text = value.to_str().map_err(|_| AuthError::Malformed)?;
        let token = text
            .strip_prefix("Bearer ")
            .or_else(|| text.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .ok_or(AuthError::Malformed)?;
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let caller = self.by_hash.get(&hash).cloned().ok_or(AuthError::Unknown)?;
        if let Err(not_until) = self.limiter.check_key(&caller.team) {
            let wait = not_until
                .wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
            return Err(AuthError::RateLimited { retry_after_s: wait.as_secs().max(1) });
        }
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenConfig;
    use axum::http::HeaderValue;

    fn auth(per_minute: u32) -> Auth {
        let token = |team: &str, secret: &str, admin| TokenConfig {
            team: team.into(),
            sha256: hex::encode(Sha256::digest(secret.as_bytes())),
            admin,
        };
        Auth::new(
            &AuthConfig {
                tokens: vec![token("math", "math-secret", false), token("ops", "ops-secret", true)],
            },
            per_minute,
        )
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn tokens_map_to_their_team_and_anything_else_is_refused_by_kind() {
        let auth = auth(100);
        let cases: &[(&str, Result<Caller, AuthError>)] = &[
            ("Bearer math-secret", Ok(Caller { team: "math".into(), admin: false })),
            ("Bearer ops-secret", Ok(Caller { team: "ops".into(), admin: true })),
            ("Bearer wrong", Err(AuthError::Unknown)),
            ("Basic bWF0aDpzZWNyZXQ=", Err(AuthError::Malformed)),
            ("Bearer ", Err(AuthError::Malformed)),
        ];
        for (header, expected) in cases {
            assert_eq!(&auth.check(&headers(header)), expected, "{header}");
        }
        assert_eq!(auth.check(&HeaderMap::new()), Err(AuthError::Missing));
        let math = Caller { team: "math".into(), admin: false };
        assert!(math.may_act_for("math") && !math.may_act_for("ops"));
    }

    #[test]
    fn a_new_token_is_fresh_and_its_entry_lets_it_in() {
        let first = new_token("vision", true).unwrap();
        let second = new_token("vision", true).unwrap();
        assert_ne!(first.token, second.token);
        assert!(first.token.starts_with("rlvr_") && first.token.len() == 5 + 64);
        assert!(!first.entry.contains(&first.token), "the entry holds the hash, never the token");
        let config: AuthConfig =
            toml::from_str(&first.entry.replace("[[auth.tokens]]", "[[tokens]]")).unwrap();
        let auth = Auth::new(&config, 100);
        let caller = auth.check(&headers(&format!("Bearer {}", first.token))).unwrap();
        assert_eq!(caller, Caller { team: "vision".into(), admin: true });
    }

    #[test]
    fn each_team_has_its_own_allowance() {
        let auth = auth(3);
        for _ in 0..3 {
            auth.check(&headers("Bearer math-secret")).unwrap();
        }
        assert!(matches!(auth.check(&headers("Bearer math-secret")), Err(AuthError::RateLimited { .. })));
        auth.check(&headers("Bearer ops-secret")).expect("another team is not held back");
    }
}
