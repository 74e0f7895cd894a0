//! The Tinker front door's training clients, on the daemon's side (the routes are
//! `api::tinker`): each client's requests run once each, in `seq_id` order ([`order`]); each
//! operation's future, which `retrieve_future` polls, held until it ends ([`futures`]); the
//! `tinker://` paths of saved states and samplers, each in its team's directory ([`paths`]).

pub mod clients;
pub mod futures;
pub mod order;
pub mod paths;
pub mod samplers;
