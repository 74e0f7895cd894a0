//! A pass over a right-padded batch's real positions only ([`Llama::forward_real`]): its hidden
//! states and gradients are the padded pass's at those positions, to the rounding of matmuls
//! over fewer rows; the padded layout it scatters to holds zeros at the padding.

use rlvr_model::model::{Padding, RealPositions};
use rlvr_model::{KvCache, LoadedModel, load, positions_from_mask};
use tch::{Device, Kind, Tensor};

/// The largest difference relative to the largest value of `b`.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}

#[test]
fn the_real_positions_pass_equals_the_padded_pass_at_those_positions() {
    // A GQA model with q/k/v biases (the Qwen layout) at one layer, and the tiny model.
    for source in ["builtin:tiny-arith", "builtin:random-qwen2.5-0.5b?layers=1"] {
        let LoadedModel { vs, model, .. } = load(source, Device::Cpu, Kind::Float).unwrap();
        // Two prompts of different lengths (left-padded) in the cache, then right-padded
        // completions of 5, 2, 0 and 3 tokens.
        let prompt_ids = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9, 10, 11]).view([2, 4]);
        let prompt_mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1]).view([2, 4]);
        let rows = Tensor::from_slice(&[0i64, 0, 1, 1]);
        let lengths = [5usize, 2, 0, 3];
        let t = 5;
        let mut ids = Vec::new();
        for (r, &len) in lengths.iter().enumerate() {
            ids.extend((0..t).map(|j| if (j as usize) < len { 12 + r as i64 + j } else { 0 }));
        }
        let ids = Tensor::from_slice(&ids).view([4, t]);
        let completion_mask = Tensor::from_slice(
            &lengths
                .iter()
                .flat_map(|&len| (0..t as usize).map(move |j| i64::from(j < len)))
                .collect::<Vec<_>>(),
        )
        .view([4, t]);
        let mask = Tensor::cat(&[prompt_mask.index_select(0, &rows), completion_mask], 1);
        let lens = prompt_mask.sum_dim_intlist(1, false, Kind::Int64).index_select(0, &rows);
        let positions = lens.unsqueeze(1) + Tensor::arange(t, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let real = RealPositions::of_lengths(&lengths, t, Device::Cpu);
        assert_eq!(real.len(), 10);

        let pass = |unpadded: bool| {
            for variable in vs.variables().values() {
                if variable.grad().defined() {
                    let _ = variable.grad().zero_();
                }
            }
            let mut cache = KvCache::new();
            let _prompt = model.forward_with(
                &prompt_ids,
                &positions_from_mask(&prompt_mask),
                &prompt_mask,
                Padding::Present,
                Some(&mut cache),
            );
            let mut cache = cache.index_select(&rows);
            let hidden = if unpadded {
                let hidden =
                    model.forward_real(&ids, &positions, (&mask, Padding::Present), &real, Some(&mut cache));
                let padded = real.scatter(&hidden);
                let padding =
                    padded.reshape([4 * t, -1]).index_select(0, &Tensor::from_slice(&[7i64, 8, 9, 10]));
                assert_eq!(padding.abs().max().double_value(&[]), 0.0, "{source}: padding rows are zeros");
                padded
            } else {
                model.forward_with(&ids, &positions, &mask, Padding::Present, Some(&mut cache))
            };
            let picked = real.gather(&hidden);
            // A loss that weighs every real position and hidden unit differently.
            let weights = Tensor::arange(picked.numel() as i64, (Kind::Float, Device::Cpu))
                .view(picked.size().as_slice())
                .sin();
            (&picked * weights).sum(Kind::Float).backward();
            let mut grads: Vec<(String, Tensor)> =
                vs.variables().into_iter().map(|(name, v)| (name, v.grad().copy())).collect();
            grads.sort_by(|a, b| a.0.cmp(&b.0));
            (picked.detach(), grads)
        };
        let (padded, padded_grads) = pass(false);
        let (unpadded, unpadded_grads) = pass(true);
        let forward = relative(&unpadded, &padded);
        assert!(forward <= 1e-5, "{source}: hidden states differ by {forward:e}");
        for ((name, a), (_, b)) in unpadded_grads.iter().zip(&padded_grads) {
            assert!(
                a.abs().max().double_value(&[]) > 0.0 || name.contains("norm"),
                "{source}: {name} has no gradient"
            );
            let backward = relative(a, b);
            assert!(backward <= 1e-4, "{source}: {name}'s gradient differs by {backward:e}");
        }
    }
}
