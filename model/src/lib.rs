//! Models on libtorch: Llama-family models from Hugging Face directories or the built-in
//! `builtin:tiny-arith`, their tokenizers and chat templates, batched sampling with a
//! shared-prefix KV cache, and completion log-probabilities for the losses.
//!
//! No job orchestration and no training live here: the worker (`worker/`, `rlvr-worker`) drives
//! these pieces.
//! Reward models (sequence classification) load with [`load_reward_model`].
//! Start at [`load`], then [`generate`], [`completion_logprobs`] and [`training_logprobs`].
//!
//! VarStore names are the Hugging Face tensor names, so a checkpoint is a HF directory transformers
//! loads as it is. Torch's global RNG is never used for sampling: it draws from `SamplerRng`
//! (xoshiro256++ from `rlvr-seeded`).
//!
//! # Code map
//!
//! - [`config`], [`weights`]; [`model`]: `Llama`, `KvCache`, `RealPositions`, LoRA, activation
//!   checkpointing; [`lora`]: PEFT's format; [`policy`]: load, save.
//! - [`builtin`]: the built-in models made — their configs, the character tokenizer, weights from
//!   a counter-based stream straight into the job's dtype.
//! - [`reward`]: sequence-classification reward models.
//! - [`tokenizer`] and [`chat`]; [`rng`]; [`sample`]: batched sampling.
//! - [`logprobs`]: chunked logits, `training_logprobs`, `training_kl`. A training pass never
//!   holds a batch's whole logits (see ARCHITECTURE.md's invariants).
//! - [`episode`]: the tokens' half of a multi-turn episode (token in, token out); `rlvr-env` is
//!   the environment's half, and the worker's `episodes` plays a round with both.
//! - [`onednn`], [`cuda_settings`], [`cuda_memory`], [`optimizer`] (AdamW's fused kernel, a
//!   gradient set to none), each with its `csrc/*.cpp`, and `ffi.rs` (the C++ errors read back):
//!   the project's only C++.

pub mod builtin;
pub mod chat;
pub mod config;
pub mod cuda_memory;
pub mod cuda_settings;
pub mod episode;
pub mod error;
mod ffi;
pub mod logprobs;
pub mod lora;
pub mod model;
pub mod onednn;
pub mod optimizer;
pub mod policy;
pub mod reward;
pub mod rng;
pub mod sample;
pub mod tokenizer;
pub mod weights;

pub use chat::{ChatMessage, ChatTemplate, SpecialTokens};
pub use config::{LlamaConfig, ModelSpec, RopeScaling};
pub use episode::{Episode, EpisodeError, PrefixBreak};
pub use error::{ModelError, Result};
pub use logprobs::{SequenceBatch, TrainingLogprobs, completion_logprobs, training_logprobs};
pub use lora::{LoraConfig, LoraTarget};
pub use model::{KvCache, Llama, Padding, positions_from_mask};
pub use policy::{Adapters, LoadedModel, TrainableSnapshot, load, save_adapter, save_base, save_pretrained};
pub use reward::{RewardModel, load_reward_model};
pub use rng::SamplerRng;
pub use sample::{Finish, Sampled, SamplingParams, StopScan, generate, logprob_temperature, sample_logits};
pub use tokenizer::Tokenizer;
