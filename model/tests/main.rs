//! The model crate's integration tests, one binary (each file a module): libtorch is linked once
//! instead of once per file.

mod common;

mod builtin_shapes;
mod checkpointing;
mod chunked_logits;
mod distill_kl;
mod episode;
mod lora;
mod models;
mod parity_smollm2;
mod reward_model_parity;
mod sampling;
mod unpadded;
