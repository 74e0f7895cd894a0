//! The integration stories that hold tensors in the test process itself — a model's weights, the
//! optimizer plugins' tensors through libtorch — in a binary of their own, so that only their
//! processes load libtorch (see `main.rs`).

mod conformance;
mod estimate;
mod reward_model;
mod reward_training;
mod worker;
