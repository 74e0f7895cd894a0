//! The Tinker front door's training clients, on the daemon's side (the routes are
//! `api::tinker`): each client's requests run once each, in `seq_id` order ([`order`]).

pub mod order;
