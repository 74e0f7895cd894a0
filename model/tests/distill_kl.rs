//! Distillation's KL in chunks (`training_kl`): its values equal KL(p ‖ q) computed from the
//! whole `[B × C × V]` logits of student and teacher, both ways (forward, reverse) and at a
//! temperature; it is zero for a model against itself; and its gradients with chunks of 1, 3 and
//! 9 positions equal those of one chunk holding every position.

use crate::common;

use rlvr_model::logprobs::{KlDirection, training_kl};
use rlvr_model::{LoadedModel, SequenceBatch, completion_logprobs, load};
use tch::{Device, Kind, Tensor};

fn pairs() -> Vec<(Vec<i64>, Vec<i64>)> {
    vec![
        (vec![1, 20, 23, 21], vec![30, 22, 31, 24, 2]),
        (vec![1, 20, 23, 21], vec![33, 2]),
        (vec![1, 40, 41], vec![50, 51, 52, 53, 54, 55, 2]),
        (vec![1, 40, 41], vec![]),
    ]
}

const WHOLE: i64 = 1 << 20;

/// KL(p ‖ q) per position from the whole logits of the two models' hidden states.
fn whole_kl(
    student: &LoadedModel,
    teacher: &LoadedModel,
    batch: &SequenceBatch,
    tau: f64,
    direction: KlDirection,
) -> Tensor {
    let (_, hs) = completion_logprobs(&student.model, batch, 1.0);
    let (_, ht) = completion_logprobs(&teacher.model, batch, 1.0);
    tch::no_grad(|| {
        let s = (student.model.logits(&hs) / tau).log_softmax(-1, Kind::Float);
        let t = (teacher.model.logits(&ht) / tau).log_softmax(-1, Kind::Float);
        let (p, q) = match direction {
            KlDirection::Forward => (t, s),
            KlDirection::Reverse => (s, t),
        };
        (p.exp() * (&p - q)).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float) * batch.mask()
    })
}

/// The student's gradients (names sorted) after a backward of Σ KL at chunk size `chunk`.
fn gradients(
    student: &LoadedModel,
    teacher: &LoadedModel,
    batch: &SequenceBatch,
    chunk: i64,
    direction: KlDirection,
) -> Vec<Tensor> {
    for (_, t) in student.vs.variables() {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    student.model.set_logits_chunk(chunk);
    let pass = training_kl(&student.model, &teacher.model, batch, 2.0, direction);
    pass.kl().sum(Kind::Float).backward();
    pass.backward();
    let mut named: Vec<(String, Tensor)> = student.vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named.into_iter().map(|(_, t)| t.grad().copy()).collect()
}

#[test]
fn the_kl_in_chunks_is_the_whole_logits_kl_and_so_are_its_gradients() {
    let mut student = load("builtin:tiny-arith?seed=1", Device::Cpu, Kind::Float).unwrap();
    student.vs.unfreeze();
    let teacher = load("builtin:tiny-arith?seed=2", Device::Cpu, Kind::Float).unwrap();
    let batch = SequenceBatch::new(&pairs(), 0, Device::Cpu).unwrap();
    for direction in [KlDirection::Forward, KlDirection::Reverse] {
        for tau in [1.0, 2.0] {
            let expected = whole_kl(&student, &teacher, &batch, tau, direction);
            for chunk in [1, 3, 9, WHOLE] {
                student.model.set_logits_chunk(chunk);
                let pass = training_kl(&student.model, &teacher.model, &batch, tau, direction);
                let got = pass.kl().detach();
                drop(pass);
                let diff = common::max_abs_diff(&expected, &got);
                assert!(diff < 1e-5, "{direction:?} τ={tau} chunk {chunk}: {diff:e}");
                assert!(got.sum(Kind::Float).double_value(&[]) > 0.0, "two different models differ");
                assert_eq!(
                    Vec::<f32>::try_from(got.get(3)).unwrap(),
                    vec![0.0; 7],
                    "the empty row is masked"
                );
            }
        }
        let itself = training_kl(&student.model, &student.model, &batch, 1.0, direction);
        assert!(itself.kl().abs().max().double_value(&[]) < 1e-5, "a model against itself");
        drop(itself);

        let whole = gradients(&student, &teacher, &batch, WHOLE, direction);
        assert!(whole.iter().any(|g| g.abs().max().double_value(&[]) > 0.0), "some gradient");
        for chunk in [1, 3, 9] {
            let chunked = gradients(&student, &teacher, &batch, chunk, direction);
            let worst =
                whole.iter().zip(&chunked).map(|(a, b)| common::max_abs_diff(a, b)).fold(0.0, f64::max);
            assert!(worst < 1e-5, "{direction:?} chunk {chunk}: gradients differ by {worst:e}");
        }
    }
}
