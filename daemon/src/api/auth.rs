//! Bearer tokens, the per-team rate limit and the per-address limit on failed authentications:
//! checked once, by [`require_token`], before any handler or extractor of a token route runs.
//!
//! The config holds only each token's SHA-256 (`[[auth.tokens]]`); a request's token is hashed
//! and looked up, so the daemon never holds a token and never logs one. Rate limits are per team,
//! so one team's runaway script cannot starve another's tools.
//!
//! Failed authentications (no token, a malformed header, an unknown token) are limited per client
//! address: past `api.auth_failures_per_minute` they get 429 with Retry-After instead of 401. A
//! valid token is never held back by that limit, even from an address over it: behind the default
//! loopback listener or a reverse proxy every client shares one address, and a limit that refused
//! valid tokens would let any one of them lock every team out. The tokens are long random secrets,
//! so it is not this limit that makes them unguessable; it bounds what a scan costs and makes it
//! show (`rlvr_api_auth_refusals_total`).
//!
//! A team also has at most `api.requests_per_team` requests open at once (429 past it): a request
//! holds its place from the check to the last byte of its answer, so a team cannot take every
//! connection with slow downloads or streams, whatever its request rate.
//!
//! The Tinker SDK's routes (`/api/v1/…`, [`Scheme::ApiKey`]) count against budgets of their own,
//! `tinker.rate_limit_per_minute` and `tinker.requests_per_team`: a training loop makes several
//! small requests per operation (its post, its polls, each sample its own), many more than a
//! person's tools, and must not take the allowance a team's CLI and web page need (or be held to it).
//!
//! Rate limits are governor's. Handlers take the [`Caller`] from the request's extensions. A job's
//! token (`jobs::tokens`, minted by the supervisor for each run of an engine job, valid while its
//! `JobToken` lives) reaches `POST /v1/verify` only.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderName;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sha2::{Digest, Sha256};

use super::failure::Failure;
use super::lanes::{Caps, Lane, Lanes, Ticket, Work};
use crate::config::AuthConfig;
use crate::jobs::tokens::{JobTokens, TokenJob};
use crate::metrics::ReasonLabel;

/// A fresh token: `rlvr_` (or `tml-`, a Tinker SDK's key) and 32 random bytes in hex, from the
/// OS's CSPRNG.
pub struct NewToken {
    /// The token, shown once to whoever hands it to the team.
    pub token: String,
    /// The `[[auth.tokens]]` entry to paste into the config: its sha256, never the token.
    pub entry: String,
}

/// What a token is handed to: rlvr's own clients (`Authorization: Bearer rlvr_…`), or the Tinker
/// SDK (`X-API-Key: tml-…`, the prefix the SDK insists on). Either is the team's token, checked
/// and limited alike; the prefix only says which client it was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Rlvr,
    Tinker,
}

/// Makes a token for `team` (an admin token when `admin`). Errors: the OS has no randomness.
pub fn new_token(team: &str, admin: bool, kind: TokenKind) -> Result<NewToken, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let prefix = match kind {
        TokenKind::Rlvr => "rlvr_",
        TokenKind::Tinker => rlvr_protocol::tinker::KEY_PREFIX,
    };
    let token = format!("{prefix}{}", hex::encode(bytes));
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
    /// A job's own token (an engine's, for its rewards): the job; it reaches `POST /v1/verify`
    /// only, as its team. `None`: a token of the config.
    pub job: Option<TokenJob>,
}

/// Where a request's token is: rlvr's routes read `Authorization: Bearer`, the Tinker SDK's
/// (under `/api/v1/`) `X-API-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Bearer,
    ApiKey,
}

impl Scheme {
    /// The scheme of a request to `path`.
    pub fn of(path: &str) -> Scheme {
        match path.strip_prefix(rlvr_protocol::tinker::API_PREFIX) {
            Some(rest) if rest.starts_with('/') => Scheme::ApiKey,
            _ => Scheme::Bearer,
        }
    }
}

/// The Tinker SDK's key header.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The one route a job's token reaches: the engine grades its completions there.
const JOB_TOKEN_ROUTE: (&str, &str) = ("POST", "/v1/verify");

impl Caller {
    /// Whether this caller may see and cancel a job of `team`.
    pub fn may_act_for(&self, team: &str) -> bool {
        self.admin || self.team == team
    }
}

/// Why a request was refused before its handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer …` header (no `X-API-Key` on a Tinker route).
    Missing(Scheme),
    /// A header that is not `Bearer <token>` (an empty or unreadable `X-API-Key`).
    Malformed(Scheme),
    /// A token not in the config.
    Unknown,
    /// Too many failed authentications from this client address; retry after this many seconds.
    TooManyFailures { retry_after_s: u64 },
    /// Over the team's rate limit (`setting` names it); retry after this many seconds.
    RateLimited { retry_after_s: u64, setting: &'static str },
    /// The team has `api.requests_per_team` requests open: the message says so.
    Busy(String),
}

impl From<AuthError> for Failure {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::Missing(Scheme::Bearer) => Failure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "expected an Authorization: Bearer <token> header",
            ),
            AuthError::Missing(Scheme::ApiKey) => Failure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "expected an X-API-Key: <key> header (a tml- key from rlvrd token new --tinker)",
            ),
            AuthError::Malformed(Scheme::Bearer) => Failure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "expected the Authorization header as Bearer <token>",
            ),
            AuthError::Malformed(Scheme::ApiKey) => Failure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "expected the X-API-Key header as the key itself",
            ),
            AuthError::Unknown => Failure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "the bearer token is not in the daemon's config",
            ),
            AuthError::TooManyFailures { retry_after_s } => Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_failures",
                format!(
                    "too many requests without a valid token from this address \
                     (api.auth_failures_per_minute); retry in {retry_after_s} s"
                ),
            )
            .retry(retry_after_s),
            AuthError::RateLimited { retry_after_s, setting } => Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("this team's request rate is over {setting}; retry in {retry_after_s} s"),
            )
            .retry(retry_after_s),
            AuthError::Busy(message) => Failure::new(StatusCode::TOO_MANY_REQUESTS, "busy", message).retry(1),
        }
    }
}

impl AuthError {
    /// The `reason` label of `rlvr_api_auth_refusals_total`.
    fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing(_) => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::Unknown => "unknown",
            AuthError::TooManyFailures { .. } => "too_many_failures",
            AuthError::RateLimited { .. } => "rate_limited",
            AuthError::Busy(_) => "busy",
        }
    }
}

/// The rates [`Auth`] allows, per minute.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `api.rate_limit_per_minute`: requests per team.
    pub per_team: u32,
    /// `api.auth_failures_per_minute`: failed authentications per client address.
    pub failures_per_address: u32,
    /// `api.requests_per_team`: requests open at once per team.
    pub requests_per_team: u32,
    /// `tinker.rate_limit_per_minute` and `tinker.requests_per_team`: the same, on the Tinker
    /// SDK's routes.
    pub sdk_per_team: u32,
    pub sdk_requests_per_team: u32,
}

/// How often the failure limiter forgets addresses whose allowance is full again: it is keyed by
/// whoever connects, so it would otherwise grow with every address ever seen.
const FORGET_EVERY: Duration = Duration::from_secs(60);

/// The configured tokens and the limiters.
pub struct Auth {
    by_hash: HashMap<[u8; 32], Caller>,
    jobs: Arc<JobTokens>,
    per_team: DefaultKeyedRateLimiter<String>,
    /// The Tinker SDK's routes' own.
    sdk_per_team: DefaultKeyedRateLimiter<String>,
    failures: DefaultKeyedRateLimiter<IpAddr>,
    last_forget: Mutex<Instant>,
    refusals: Family<ReasonLabel, Counter>,
    /// Teams' open requests; `api.max_connections` bounds them all together.
    open: Arc<Lanes>,
    /// Teams' open requests on the Tinker SDK's routes.
    sdk_open: Arc<Lanes>,
}

impl Auth {
    /// From `[auth]` (hashes already checked by the config loader) and the limits; each refusal
    /// is counted in `refusals` by its reason.
    pub fn new(
        config: &AuthConfig,
        jobs: Arc<JobTokens>,
        limits: Limits,
        refusals: Family<ReasonLabel, Counter>,
    ) -> Self {
        let by_hash = config
            .tokens
            .iter()
            .filter_map(|token| {
                let bytes: [u8; 32] = hex::decode(&token.sha256).ok()?.try_into().ok()?;
                Some((bytes, Caller { team: token.team.clone(), admin: token.admin, job: None }))
            })
            .collect();
        Auth {
            by_hash,
            jobs,
            per_team: RateLimiter::keyed(whole_minute_at_once(limits.per_team)),
            sdk_per_team: RateLimiter::keyed(whole_minute_at_once(limits.sdk_per_team)),
            failures: RateLimiter::keyed(whole_minute_at_once(limits.failures_per_address)),
            last_forget: Mutex::new(Instant::now()),
            refusals,
            open: Lanes::new(
                Caps { at_once: usize::MAX, per_team: limits.requests_per_team as usize },
                Work { taking: "request(s) open", per_team_setting: "api.requests_per_team" },
            ),
            sdk_open: Lanes::new(
                Caps { at_once: usize::MAX, per_team: limits.sdk_requests_per_team as usize },
                Work { taking: "Tinker request(s) open", per_team_setting: "tinker.requests_per_team" },
            ),
        }
    }

    /// The caller of a request from `peer`, within its team's rate limit; a failure counts
    /// against `peer`'s allowance.
    pub fn check(&self, peer: IpAddr, headers: &HeaderMap, scheme: Scheme) -> Result<Caller, AuthError> {
        let checked = match self.identify(headers, scheme) {
            // The daemon's own tokens: an engine's grading is bounded by the verify route's
            // concurrency, not by its team's request rate.
            Ok(caller) if caller.job.is_some() => Ok(caller),
            Ok(caller) => {
                let (limiter, setting) = match scheme {
                    Scheme::Bearer => (&self.per_team, "api.rate_limit_per_minute"),
                    Scheme::ApiKey => (&self.sdk_per_team, "tinker.rate_limit_per_minute"),
                };
                match limiter.check_key(&caller.team) {
                    Ok(()) => Ok(caller),
                    Err(not_until) => {
                        Err(AuthError::RateLimited { retry_after_s: retry_after(&not_until), setting })
                    }
                }
            }
            Err(failure) => {
                self.forget_now_and_then();
                match self.failures.check_key(&address_key(peer)) {
                    Ok(()) => Err(failure),
                    Err(not_until) => {
                        Err(AuthError::TooManyFailures { retry_after_s: retry_after(&not_until) })
                    }
                }
            }
        };
        if let Err(error) = &checked {
            self.refused(peer, error);
        }
        checked
    }

    /// A place among the team's open requests for `caller`'s request, held until dropped; a job's
    /// token takes none (its grading is bounded by its lane on the verify route).
    pub fn open(&self, peer: IpAddr, caller: &Caller, scheme: Scheme) -> Result<Option<Ticket>, AuthError> {
        if caller.job.is_some() {
            return Ok(None);
        }
        let open = match scheme {
            Scheme::Bearer => &self.open,
            Scheme::ApiKey => &self.sdk_open,
        };
        open.try_take(Lane::Team(caller.team.clone())).map(Some).map_err(|message| {
            let error = AuthError::Busy(message);
            self.refused(peer, &error);
            error
        })
    }

    fn refused(&self, peer: IpAddr, error: &AuthError) {
        self.refusals.get_or_create(&ReasonLabel { reason: error.reason() }).inc();
        tracing::debug!(%peer, reason = error.reason(), "request refused before its handler");
    }

    /// The token's caller, without any limit.
    fn identify(&self, headers: &HeaderMap, scheme: Scheme) -> Result<Caller, AuthError> {
        let header = match scheme {
            Scheme::Bearer => AUTHORIZATION,
            Scheme::ApiKey => X_API_KEY,
        };
        let value = headers.get(header).ok_or(AuthError::Missing(scheme))?;
        let text = value.to_str().map_err(|_| AuthError::Malformed(scheme))?;
        let token = match scheme {
            Scheme::Bearer => text.strip_prefix("Bearer ").or_else(|| text.strip_prefix("bearer ")),
            Scheme::ApiKey => Some(text),
        }
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or(AuthError::Malformed(scheme))?;
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let job = || {
            self.jobs.get(&hash).map(|job| Caller { team: job.team.clone(), admin: false, job: Some(job) })
        };
        self.by_hash.get(&hash).cloned().or_else(job).ok_or(AuthError::Unknown)
    }

    fn forget_now_and_then(&self) {
        let mut last = self.last_forget.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.elapsed() >= FORGET_EVERY {
            *last = Instant::now();
            self.failures.retain_recent();
            self.failures.shrink_to_fit();
        }
    }
}

/// `per_minute` a minute, the whole minute's allowance at once (a bulk submit), then refilling
/// evenly.
fn whole_minute_at_once(per_minute: u32) -> Quota {
    let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
    Quota::per_minute(per_minute).allow_burst(per_minute)
}

fn retry_after(not_until: &NotUntil<<DefaultClock as Clock>::Instant>) -> u64 {
    not_until.wait_time_from(DefaultClock::default().now()).as_secs().max(1)
}

/// The key a client address's failures count under: an IPv4 address, or an IPv6 address's /64,
/// since one host is commonly given a whole /64 and could otherwise take a fresh allowance from
/// each of its addresses.
fn address_key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !(u128::from(u64::MAX));
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

/// The middleware of every route but `/healthz` and `/metrics`: the token is checked (and the
/// limits) before any extractor runs, so a refused request's body is never read; the handler
/// finds the [`Caller`] in the request's extensions. The request's place among its team's open
/// requests goes with its answer's body.
pub async fn require_token(
    State(auth): State<Arc<Auth>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let scheme = Scheme::of(request.uri().path());
    match auth.check(peer.ip(), request.headers(), scheme) {
        Ok(caller)
            if caller.job.is_some()
                && (request.method().as_str(), request.uri().path()) != JOB_TOKEN_ROUTE =>
        {
            Failure::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                format!("a job's token reaches {} {} only", JOB_TOKEN_ROUTE.0, JOB_TOKEN_ROUTE.1),
            )
            .into_response()
        }
        Ok(caller) => match auth.open(peer.ip(), &caller, scheme) {
            Ok(place) => {
                request.extensions_mut().insert(caller);
                let response = next.run(request).await;
                match place {
                    Some(place) => response.map(|body| Body::new(Holding { body, _place: place })),
                    None => response,
                }
            }
            Err(error) => Failure::from(error).into_response(),
        },
        Err(error) => Failure::from(error).into_response(),
    }
}

/// An answer's body that holds its request's place until it is sent whole or dropped (the client
/// gone): a download or an event stream counts as open for as long as it runs.
struct Holding {
    body: Body,
    _place: Ticket,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenConfig;
    use axum::http::HeaderValue;

    fn auth(per_team: u32, failures_per_address: u32) -> Auth {
        let token = |team: &str, secret: &str, admin| TokenConfig {
            team: team.into(),
            sha256: hex::encode(Sha256::digest(secret.as_bytes())),
            admin,
        };
        Auth::new(
            &AuthConfig {
                tokens: vec![token("math", "math-secret", false), token("ops", "ops-secret", true)],
            },
            Arc::default(),
            Limits {
                per_team,
                failures_per_address,
                requests_per_team: 100,
                sdk_per_team: 100,
                sdk_requests_per_team: 100,
            },
            Family::default(),
        )
    }

    fn headers(value: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// Checks each header in turn from `peer` against what `auth` answers.
    fn check(auth: &Auth, cases: &[(IpAddr, Option<&str>, Result<Caller, AuthError>)]) {
        for (peer, header, expected) in cases {
            let got = auth.check(*peer, &headers(*header), Scheme::Bearer).map_err(|error| match error {
                // The wait depends on the clock; its presence is what is checked.
                AuthError::TooManyFailures { .. } => AuthError::TooManyFailures { retry_after_s: 1 },
                AuthError::RateLimited { setting, .. } => {
                    AuthError::RateLimited { retry_after_s: 1, setting }
                }
                other => other,
            });
            assert_eq!(&got, expected, "{peer} {header:?}");
        }
    }

    fn caller(team: &str, admin: bool) -> Result<Caller, AuthError> {
        Ok(Caller { team: team.into(), admin, job: None })
    }

    #[test]
    fn tokens_map_to_their_team_and_anything_else_is_refused_by_kind() {
        let auth = auth(100, 100);
        check(
            &auth,
            &[
                (HOME, Some("Bearer math-secret"), caller("math", false)),
                (HOME, Some("Bearer ops-secret"), caller("ops", true)),
                (HOME, Some("Bearer wrong"), Err(AuthError::Unknown)),
                (HOME, Some("Basic bWF0aDpzZWNyZXQ="), Err(AuthError::Malformed(Scheme::Bearer))),
                (HOME, Some("Bearer "), Err(AuthError::Malformed(Scheme::Bearer))),
                (HOME, None, Err(AuthError::Missing(Scheme::Bearer))),
            ],
        );
        let math = Caller { team: "math".into(), admin: false, job: None };
        assert!(math.may_act_for("math") && !math.may_act_for("ops"));
    }

    #[test]
    fn a_new_token_is_fresh_and_its_entry_lets_it_in() {
        let first = new_token("vision", true, TokenKind::Rlvr).unwrap();
        let second = new_token("vision", true, TokenKind::Rlvr).unwrap();
        assert_ne!(first.token, second.token);
        assert!(first.token.starts_with("rlvr_") && first.token.len() == 5 + 64);
        assert!(!first.entry.contains(&first.token), "the entry holds the hash, never the token");
        let config: AuthConfig =
            toml::from_str(&first.entry.replace("[[auth.tokens]]", "[[tokens]]")).unwrap();
        let auth = Auth::new(
            &config,
            Arc::default(),
            Limits {
                per_team: 100,
                failures_per_address: 100,
                requests_per_team: 100,
                sdk_per_team: 100,
                sdk_requests_per_team: 100,
            },
            Family::default(),
        );
        let caller =
            auth.check(HOME, &headers(Some(&format!("Bearer {}", first.token))), Scheme::Bearer).unwrap();
        assert_eq!(caller, Caller { team: "vision".into(), admin: true, job: None });
    }

    #[test]
    fn a_tinker_key_is_the_teams_token_read_from_x_api_key_on_the_sdks_routes() {
        let key = new_token("vision", false, TokenKind::Tinker).unwrap();
        assert!(key.token.starts_with("tml-") && key.token.len() == 4 + 64, "{}", key.token);
        let config: AuthConfig = toml::from_str(&key.entry.replace("[[auth.tokens]]", "[[tokens]]")).unwrap();
        let auth = Auth::new(
            &config,
            Arc::default(),
            Limits {
                per_team: 100,
                failures_per_address: 100,
                requests_per_team: 100,
                sdk_per_team: 100,
                sdk_requests_per_team: 100,
            },
            Family::default(),
        );
        let api_key = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(X_API_KEY, HeaderValue::from_str(value).unwrap());
            headers
        };
        let vision = Caller { team: "vision".into(), admin: false, job: None };
        assert_eq!(auth.check(HOME, &api_key(&key.token), Scheme::ApiKey), Ok(vision.clone()));
        // The same key as a bearer token on rlvr's routes: the team's token too.
        assert_eq!(
            auth.check(HOME, &headers(Some(&format!("Bearer {}", key.token))), Scheme::Bearer),
            Ok(vision)
        );
        // Each scheme reads its own header only.
        assert_eq!(
            auth.check(HOME, &api_key(&key.token), Scheme::Bearer),
            Err(AuthError::Missing(Scheme::Bearer))
        );
        assert_eq!(
            auth.check(HOME, &headers(Some(&format!("Bearer {}", key.token))), Scheme::ApiKey),
            Err(AuthError::Missing(Scheme::ApiKey))
        );
        assert_eq!(
            auth.check(HOME, &api_key(" "), Scheme::ApiKey),
            Err(AuthError::Malformed(Scheme::ApiKey))
        );
        assert_eq!(auth.check(HOME, &api_key("tml-guess"), Scheme::ApiKey), Err(AuthError::Unknown));
        // (path, scheme)
        let routes = [
            ("/api/v1/create_session", Scheme::ApiKey),
            ("/api/v1/samplers/s:sample:0", Scheme::ApiKey),
            ("/api/v1", Scheme::Bearer),
            ("/api/v10/x", Scheme::Bearer),
            ("/v1/jobs", Scheme::Bearer),
        ];
        for (path, scheme) in routes {
            assert_eq!(Scheme::of(path), scheme, "{path}");
        }
    }

    #[test]
    fn each_team_has_its_own_allowance() {
        let auth = auth(3, 100);
        let math = (HOME, Some("Bearer math-secret"), caller("math", false));
        let limited = Err(AuthError::RateLimited { retry_after_s: 1, setting: "api.rate_limit_per_minute" });
        check(
            &auth,
            &[
                math.clone(),
                math.clone(),
                math,
                (HOME, Some("Bearer math-secret"), limited),
                // Another team is not held back.
                (HOME, Some("Bearer ops-secret"), caller("ops", true)),
            ],
        );
    }

    /// The Tinker SDK's routes count against a budget of their own: a training loop's many small
    /// requests neither take the team's tools' allowance nor are held to it.
    #[test]
    fn the_sdks_routes_have_their_own_allowance() {
        let config = AuthConfig {
            tokens: vec![crate::config::TokenConfig {
                team: "math".into(),
                sha256: hex::encode(Sha256::digest(b"tml-math")),
                admin: false,
            }],
        };
        let limits = Limits {
            per_team: 1,
            failures_per_address: 100,
            requests_per_team: 100,
            sdk_per_team: 2,
            sdk_requests_per_team: 100,
        };
        let auth = Auth::new(&config, Arc::default(), limits, Family::default());
        let mut bearer = HeaderMap::new();
        bearer.insert(AUTHORIZATION, "Bearer tml-math".parse().unwrap());
        let mut key = HeaderMap::new();
        key.insert(X_API_KEY, "tml-math".parse().unwrap());
        let setting = |result: Result<Caller, AuthError>| match result {
            Ok(_) => "ok",
            Err(AuthError::RateLimited { setting, .. }) => setting,
            Err(other) => panic!("{other:?}"),
        };
        let got = [
            setting(auth.check(HOME, &bearer, Scheme::Bearer)),
            setting(auth.check(HOME, &bearer, Scheme::Bearer)),
            setting(auth.check(HOME, &key, Scheme::ApiKey)),
            setting(auth.check(HOME, &key, Scheme::ApiKey)),
            setting(auth.check(HOME, &key, Scheme::ApiKey)),
        ];
        assert_eq!(got, ["ok", "api.rate_limit_per_minute", "ok", "ok", "tinker.rate_limit_per_minute"]);
    }

    // regression: failed logins were not rate-limited
    #[test]
    fn failures_are_limited_per_address_and_never_hold_back_a_valid_token() {
        let auth = auth(100, 3);
        let other: IpAddr = "192.0.2.7".parse().unwrap();
        let too_many = Err(AuthError::TooManyFailures { retry_after_s: 1 });
        check(
            &auth,
            &[
                // Every kind of failure counts.
                (HOME, None, Err(AuthError::Missing(Scheme::Bearer))),
                (HOME, Some("Basic x"), Err(AuthError::Malformed(Scheme::Bearer))),
                (HOME, Some("Bearer guess"), Err(AuthError::Unknown)),
                (HOME, Some("Bearer guess"), too_many.clone()),
                (HOME, None, too_many),
                // A valid token from the same address still works, and so does another address.
                (HOME, Some("Bearer math-secret"), caller("math", false)),
                (other, Some("Bearer guess"), Err(AuthError::Unknown)),
                (other, Some("Bearer ops-secret"), caller("ops", true)),
            ],
        );
    }

    #[test]
    fn a_jobs_token_is_its_team_and_job_until_dropped_and_no_team_limit_holds_it_back() {
        let jobs = Arc::new(JobTokens::default());
        let auth = Auth::new(
            &AuthConfig::default(),
            jobs.clone(),
            Limits {
                per_team: 1,
                failures_per_address: 100,
                requests_per_team: 100,
                sdk_per_team: 100,
                sdk_requests_per_team: 100,
            },
            Family::default(),
        );
        let minted = jobs.mint("math", "01JOB", 2).unwrap();
        let bearer = format!("Bearer {}", minted.token);
        let job_caller = Ok(Caller {
            team: "math".into(),
            admin: false,
            job: Some(TokenJob { team: "math".into(), id: "01JOB".into(), ranks: 2 }),
        });
        // Over the team's one request a minute, still answered.
        check(&auth, &[(HOME, Some(&bearer), job_caller.clone()), (HOME, Some(&bearer), job_caller)]);
        drop(minted);
        check(&auth, &[(HOME, Some(&bearer), Err(AuthError::Unknown))]);
    }

    #[test]
    fn failures_count_per_ipv4_address_and_per_ipv6_64() {
        let cases = [
            ("192.0.2.7", "192.0.2.7"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"),
            ("2001:db8:1:2::1", "2001:db8:1:2::"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("::1", "::"),
        ];
        for (peer, key) in cases {
            let key: IpAddr = key.parse().unwrap();
            assert_eq!(address_key(peer.parse().unwrap()), key, "{peer}");
        }
    }

    // regression: one team's slow downloads and streams could hold every connection
    #[tokio::test]
    async fn a_team_holds_at_most_its_open_requests_each_until_its_answer_is_sent_or_dropped() {
        use axum::routing::{get, post};
        use tower::ServiceExt;
        let jobs = Arc::new(JobTokens::default());
        let config = AuthConfig {
            tokens: ["math", "ops"]
                .map(|team| crate::config::TokenConfig {
                    team: team.into(),
                    sha256: hex::encode(Sha256::digest(format!("{team}-secret").as_bytes())),
                    admin: false,
                })
                .into(),
        };
        let limits = Limits {
            per_team: 100,
            failures_per_address: 100,
            requests_per_team: 2,
            sdk_per_team: 100,
            sdk_requests_per_team: 100,
        };
        let auth = Arc::new(Auth::new(&config, jobs.clone(), limits, Family::default()));
        // An answer whose body never ends (a stream, a download the client reads slowly).
        let endless =
            || async { Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()) };
        let router = axum::Router::new()
            .route("/held", get(endless))
            .route("/quick", get(|| async { "ok" }))
            .route("/v1/verify", post(|| async { "graded" }))
            .route_layer(axum::middleware::from_fn_with_state(auth.clone(), require_token));
        let call = |method: &str, path: &str, token: &str| {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header(AUTHORIZATION, format!("Bearer {token}"))
                .extension(ConnectInfo(SocketAddr::from((HOME, 9))))
                .body(Body::empty())
                .unwrap();
            router.clone().oneshot(request)
        };
        let status = |response: &Response| response.status().as_u16();
        let first = call("GET", "/held", "math-secret").await.unwrap();
        let second = call("GET", "/held", "math-secret").await.unwrap();
        assert_eq!((status(&first), status(&second)), (200, 200));
        let refused = call("GET", "/quick", "math-secret").await.unwrap();
        assert_eq!(status(&refused), 429);
        assert_eq!(refused.headers()["retry-after"], "1");
        let body = axum::body::to_bytes(refused.into_body(), 1 << 16).await.unwrap();
        let expected = "your team has 2 request(s) open already (api.requests_per_team); retry when one ends";
        assert!(String::from_utf8_lossy(&body).contains(expected), "{body:?}");
        // Another team, and the team's engine job grading with its own token, are not held back.
        assert_eq!(status(&call("GET", "/quick", "ops-secret").await.unwrap()), 200);
        let job = jobs.mint("math", "01JOB", 1).unwrap();
        assert_eq!(status(&call("POST", "/v1/verify", &job.token).await.unwrap()), 200);
        // A dropped answer (its client gone) gives its place back; an answer read whole does too.
        drop(first);
        for _ in 0..3 {
            let answer = call("GET", "/quick", "math-secret").await.unwrap();
            assert_eq!(status(&answer), 200);
            assert_eq!(axum::body::to_bytes(answer.into_body(), 16).await.unwrap(), "ok");
        }
        let third = call("GET", "/held", "math-secret").await.unwrap();
        assert_eq!(status(&third), 200);
        assert_eq!(status(&call("GET", "/quick", "math-secret").await.unwrap()), 429);
        let busy = auth.refusals.get_or_create(&ReasonLabel { reason: "busy" }).get();
        assert_eq!(busy, 2);
        drop((second, third));
    }
}
