//! Job specs, queue names and job state on Redis, shared by `rlvrd` and `rlvrctl`.
//!
//! Empty until the job lifecycle lands (issue 5); the crate exists so the workspace layout of the
//! design (§1) holds and the boundary "queue knows nothing about libtorch" is visible from day one.
