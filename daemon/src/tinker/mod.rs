//! The Tinker front door's training clients, on the daemon's side (the routes are
//! `api::tinker`): each client's requests run once each, in `seq_id` order ([`order`]); each
//! operation's future, which `retrieve_future` polls, held until it ends ([`futures`]); the
//! clients' processes ([`clients`]) and samplers ([`samplers`]). The `tinker://` paths of saved
//! states are `rlvr_protocol::tinker::paths` (a job's `model.policy` may name one too).

pub mod clients;
pub mod futures;
pub mod order;
pub mod samplers;
