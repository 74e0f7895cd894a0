//! Batched sampling of every completion of a step, with a KV cache and a shared prompt prefix.
//!
//! Each distinct prompt is prefilled once (left padding, attention mask, positions from the
//! mask) and its cache is expanded to its `group_size` completions. Rows that finish stop
//! growing; when half the rows of the running batch have finished, the batch is compacted.
//!
//! **One read from the device per token.** Reading a tensor's values on the host waits for
//! every kernel queued on its device, and so does a plain copy to the device; on a GPU each such
//! wait empties the launch queue. A decoding step reads one thing: the `[B]` sampled token ids,
//! which the host needs to decide which completions ended (EOS, stop strings, length) and so
//! what the next step runs on. The rest stays on the device or is known on the host: whether
//! the attention mask has padding follows from the prompts' lengths
//! ([`crate::model::Padding`]), the mask of every step is built once, the log-probabilities
//! gather in a `[N, max_new_tokens]` buffer read once at the end, and each completion's random
//! numbers go to the device 64 steps at a time. (Nucleus sampling reads again in the rare step
//! whose nucleus outgrew its candidates, below; compacting the batch copies its row indices.)
//!
//! **Logprobs.** `Sampled::logprobs[i]` is `log_softmax(logits / temperature)` of the sampled
//! token: the model's distribution at the sampling temperature, before top-k/top-p filtering.
//! That is what [`crate::completion_logprobs`] computes for the same tokens at the same
//! temperature (it is the "old" policy of a PPO/GRPO ratio). Greedy decoding (temperature 0)
//! takes the argmax and records `log_softmax(logits)` (temperature 1): the untempered model's
//! log-probability of it, which is what every pass for training takes at temperature 0
//! ([`logprob_temperature`]).
//!
//! **Nucleus sampling** (top-p without top-k) ranks tokens by probability, ties by token id,
//! and keeps a token while the mass ranked before it is below `top_p` (probabilities are the
//! softmax over the whole vocabulary, in f64). It does not sort the vocabulary: it ranks the
//! `k` most likely tokens (`topk`, k = 256 at first), which gives the tokens a sort of the
//! whole vocabulary gives whenever the nucleus ends among the tokens ranked strictly above the
//! k-th (then the ranks, masses and cumulative sums it reads are the sort's, bit for bit). A
//! row whose nucleus may not end there is marked, and the step is sampled again with k four
//! times larger (up to the whole vocabulary), which the rest of the call keeps.
//!
//! **Stop strings.** A completion stops at the token whose text completes a stop string. That
//! token is kept (with its logprob) and nothing after it is generated; `text` ends with the
//! stop string (any characters the last token adds beyond it are cut from `text`, so `text`
//! can then be shorter than `decode(tokens)`). EOS tokens are kept in `tokens` (the policy
//! learns to stop) and left out of `text`. A stop string is looked for in the last
//! `longest stop string + 32` bytes of the completion's text after each token, decoding only
//! the completion's last tokens, enough of them for those bytes: see [`StopScan`].
//!
//! **Randomness.** Every completion draws from its own [`SamplerRng`] stream, forked from the
//! caller's generator in row order (one draw per completion per call, greedy decoding
//! included), and a token is sampled by inverse CDF (in f64) of one uniform over the filtered
//! distribution; greedy decoding draws no uniforms. Torch's generator is never used. Same
//! seed + same model + same inputs ⇒ same completions, on the same machine and libtorch build
//! with the same number of threads (CPU kernels are deterministic, but their float rounding
//! can depend on the thread count and on the CPU's vector units).

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::model::{KvCache, Llama, Padding, positions_from_mask};
use crate::rng::SamplerRng;
use crate::tokenizer::Tokenizer;

/// How to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Most tokens generated per completion.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy (the argmax, its log-probability untempered).
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Strings that end a completion (kept at the end of `text`).
    pub stop: Vec<String>,
    /// Sample to `max_new_tokens` whatever is sampled: an EOS token ends nothing.
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            max_new_tokens: 64,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It sampled an EOS token (kept as its last token).
    Eos,
    /// Its text reached a stop string.
    Stop,
    /// It reached `max_new_tokens`.
    Length,
}

/// One sampled completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// Index of its prompt in the `prompts` given to [`generate`].
    pub prompt_index: usize,
    /// The generated ids (EOS included when it ended on one).
    pub tokens: Vec<i64>,
    /// Per token, its log-probability under `log_softmax(logits / temperature)` (temperature 1
    /// when greedy).
    pub logprobs: Vec<f32>,
    /// The decoded text, special tokens left out, cut after a stop string.
    pub text: String,
    pub finish: Finish,
}

impl Sampled {
    /// A completion another engine sampled (`tokens` and their log-probabilities), ended by the
    /// rules [`generate`] ends its own: at the first EOS token (kept), at the token whose text
    /// completes one of `params.stop` (kept, `text` cut after the stop string), or at
    /// `params.max_new_tokens`. Whatever the engine generated after that point is dropped, so
    /// an engine's own stop rules (its detokenizer's, its EOS list) never decide what is trained
    /// on. `logprobs` must be as long as `tokens`.
    pub fn ended(
        prompt_index: usize,
        mut tokens: Vec<i64>,
        mut logprobs: Vec<f32>,
        tokenizer: &Tokenizer,
        params: &SamplingParams,
    ) -> Result<Sampled> {
        if logprobs.len() != tokens.len() {
            return Err(ModelError::InvalidInput(format!(
                "{} tokens but {} log-probabilities",
                tokens.len(),
                logprobs.len()
            )));
        }
        tokens.truncate(params.max_new_tokens);
        let mut stops = StopScan::new(&params.stop, 1);
        let mut end = None;
        for i in 0..tokens.len() {
            if !params.ignore_eos && tokenizer.is_eos(tokens[i]) {
                end = Some((i + 1, Finish::Eos, tokenizer.decode(&tokens[..i])));
                break;
            }
            if let Some(text) = stops.check(tokenizer, 0, &tokens[..=i]) {
                end = Some((i + 1, Finish::Stop, text));
                break;
            }
        }
        let (len, finish, text) = match end {
            Some(end) => end,
            // Cut at the length, or ended early for a reason the rules above do not know (an
            // engine's own EOS list): counted as cut, which is what it is to the trainer.
            None => (tokens.len(), Finish::Length, tokenizer.decode(&tokens)),
        };
        tokens.truncate(len);
        logprobs.truncate(len);
        Ok(Sampled { prompt_index, tokens, logprobs, text, finish })
    }
}

/// Samples `group_size` completions of every prompt, batched; returns `prompts.len() ×
/// group_size` items, group-contiguous (all completions of prompt 0, then of prompt 1, ...).
pub fn generate(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompts: &[Vec<i64>],
    group_size: usize,
    params: &SamplingParams,
    rng: &mut SamplerRng,
) -> Result<Vec<Sampled>> {
    check_params(params)?;
    if group_size == 0 {
        return Err(ModelError::InvalidInput("group_size must be at least 1".into()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ModelError::InvalidInput(format!("prompt {i} is empty")));
    }
    let vocab = model.vocab_size();
    if let Some(id) = prompts.iter().flatten().find(|&&id| !(0..vocab).contains(&id)) {
        return Err(ModelError::InvalidInput(format!(
            "prompt token {id} is outside the vocabulary (0..{vocab})"
        )));
    }
    let n = prompts.len() * group_size;
    // One stream per completion, forked in row order: a completion's draws do not depend on
    // when its siblings finish.
    let mut row_rngs: Vec<SamplerRng> = (0..n).map(|_| rng.fork()).collect();
    let mut rows_out: Vec<Sampled> = (0..n)
        .map(|r| Sampled {
            prompt_index: r / group_size,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            finish: Finish::Length,
        })
        .collect();
    if n == 0 || params.max_new_tokens == 0 {
        return Ok(rows_out);
    }
    tch::no_grad(|| sample_loop(model, tokenizer, prompts, group_size, params, &mut row_rngs, &mut rows_out));
    Ok(rows_out)
}

fn check_params(params: &SamplingParams) -> Result<()> {
    if !(params.temperature.is_finite() && params.temperature >= 0.0) {
        return Err(ModelError::InvalidInput(format!(
            "temperature must be ≥ 0, found {}",
            params.temperature
        )));
    }
    if !(params.top_p > 0.0 && params.top_p <= 1.0) {
        return Err(ModelError::InvalidInput(format!("top_p must be in (0, 1], found {}", params.top_p)));
    }
    if params.stop.iter().any(String::is_empty) {
        return Err(ModelError::InvalidInput("stop strings must not be empty".into()));
    }
    Ok(())
}

/// Left-pads `prompts` into `[P, L]` ids and mask.
pub(crate) fn left_pad(prompts: &[&[i64]], pad_id: i64, device: tch::Device) -> (Tensor, Tensor) {
    let len = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len() * len);
    let mut mask = Vec::with_capacity(prompts.len() * len);
    for p in prompts {
        let pad = len - p.len();
        ids.extend(std::iter::repeat_n(pad_id, pad).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1i64, p.len())));
    }
    let shape = [prompts.len() as i64, len as i64];
    (
        Tensor::from_slice(&ids).view(shape).to_device(device),
        Tensor::from_slice(&mask).view(shape).to_device(device),
    )
}

/// The temperature log-probabilities are taken at: `temperature`, or 1 for greedy decoding
/// (temperature 0), whose tokens are the argmax and whose log-probabilities are the untempered
/// model's. The sampler records them so; a training pass must take the same (a temperature 0
/// used as a divisor makes every logit infinite and the loss NaN).
pub fn logprob_temperature(temperature: f64) -> f64 {
    if temperature > 0.0 { temperature } else { 1.0 }
}

/// One step of [`generate`]'s sampling on its own: a token per row of `logits` (`[N, V]`, f32)
/// with its log-probability, `uniforms[i]` being row i's draw (none when greedy). For tests and
/// benchmarks of the sampling rule; it reads the tokens back as a decoding step does.
pub fn sample_logits(
    logits: &Tensor,
    params: &SamplingParams,
    uniforms: &[f64],
) -> Result<(Vec<i64>, Vec<f32>)> {
    check_params(params)?;
    let (rows, vocab) =
        logits.size2().map_err(|_| ModelError::InvalidInput("logits must be [N, V]".into()))?;
    let greedy = params.temperature == 0.0;
    if !greedy && uniforms.len() as i64 != rows {
        return Err(ModelError::InvalidInput(format!("{} uniforms for {rows} rows", uniforms.len())));
    }
    let logits = logits.to_kind(Kind::Float);
    let u = (!greedy).then(|| Tensor::from_slice(uniforms).to_device(logits.device()));
    let mut sampler = Sampler::new(params, vocab);
    let (_, logprobs, tokens) = sampler.step(&logits, u.as_ref());
    let logprobs = Vec::<f32>::try_from(&logprobs).expect("f32 logprobs");
    Ok((tokens, logprobs))
}

/// Steps of random numbers copied to the device at once.
const UNIFORM_CHUNK: usize = 64;

fn sample_loop(
    model: &Llama,
    tokenizer: &Tokenizer,
    prompts: &[Vec<i64>],
    group_size: usize,
    params: &SamplingParams,
    row_rngs: &mut [SamplerRng],
    out: &mut [Sampled],
) {
    let device = model.device();
    let n = out.len();
    let g = group_size as i64;
    let max_new = params.max_new_tokens;
    let refs: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
    let (ids, prompt_mask) = left_pad(&refs, tokenizer.pad_id(), device);
    let plen = ids.size()[1];
    // Whether completion r's prompt is left-padded: the mask's padding, known on the host.
    let padded: Vec<bool> = (0..n).map(|r| (prompts[r / group_size].len() as i64) < plen).collect();
    let padding_of = |rows: &[usize]| Padding::from_bool(rows.iter().any(|&r| padded[r]));

    // Prefill each distinct prompt once, then share its cache with its group.
    let mut cache = KvCache::new();
    let hidden = model.forward_with(
        &ids,
        &positions_from_mask(&prompt_mask),
        &prompt_mask,
        Padding::from_bool(padded.contains(&true)),
        Some(&mut cache),
    );
    let mut logits = model.logits(&hidden.select(1, plen - 1)).to_kind(Kind::Float);
    // The mask of every step at once: step s attends to its first plen + s + 1 columns.
    let generated = Tensor::ones([prompts.len() as i64, max_new as i64], (Kind::Int64, device));
    let mut mask = Tensor::cat(&[&prompt_mask, &generated], 1);
    let mut next_pos =
        Tensor::from_slice(&prompts.iter().map(|p| p.len() as i64).collect::<Vec<_>>()).to_device(device);
    // Room for the completions first, on the P prompt rows: the expansion copies it along.
    cache.reserve(max_new as i64);
    if g > 1 {
        cache = cache.repeat_interleave(g);
        logits = logits.repeat_interleave_self_int(g, 0, None::<i64>);
        mask = mask.repeat_interleave_self_int(g, 0, None::<i64>);
        next_pos = next_pos.repeat_interleave_self_int(g, 0, None::<i64>);
    }

    // rows[b] = which completion batch row b is; rows_on_device the same, to file each step's
    // log-probabilities in the rows of `logprob_rows` without reading them back.
    let mut rows: Vec<usize> = (0..n).collect();
    let mut rows_on_device = Tensor::arange(n as i64, (Kind::Int64, device));
    let logprob_rows = Tensor::zeros([n as i64, max_new as i64], (Kind::Float, device));
    let mut done = vec![false; n];
    let mut sampler = Sampler::new(params, model.vocab_size());
    let mut uniforms = Uniforms { sampling: params.temperature > 0.0, chunk: None, first_step: 0 };
    let mut stops = StopScan::new(&params.stop, n);
    let mut steps = 0;
    for step in 0..max_new {
        let u = uniforms.at(step, max_new, &rows, row_rngs, device);
        // The step's one read from the device: its tokens.
        let (tokens, logprobs, token_vec) = sampler.step(&logits, u.as_ref());
        let _ = logprob_rows.select(1, step as i64).index_copy_(0, &rows_on_device, &logprobs);
        steps = step + 1;
        for (b, &r) in rows.iter().enumerate() {
            if done[r] {
                continue;
            }
            let row = &mut out[r];
            row.tokens.push(token_vec[b]);
            if !params.ignore_eos && tokenizer.is_eos(token_vec[b]) {
                row.finish = Finish::Eos;
                done[r] = true;
            } else if let Some(text) = stops.check(tokenizer, r, &row.tokens) {
                row.text = text;
                row.finish = Finish::Stop;
                done[r] = true;
            }
            if !done[r] && step + 1 == max_new {
                row.finish = Finish::Length;
                done[r] = true;
            }
        }
        let active: Vec<usize> = (0..rows.len()).filter(|&b| !done[rows[b]]).collect();
        if active.is_empty() {
            break;
        }
        let mut tokens = tokens;
        if active.len() * 2 <= rows.len() {
            // Compact: drop finished rows from the batch (and their cache).
            let idx =
                Tensor::from_slice(&active.iter().map(|&b| b as i64).collect::<Vec<_>>()).to_device(device);
            cache = cache.index_select(&idx);
            mask = mask.index_select(0, &idx);
            next_pos = next_pos.index_select(0, &idx);
            tokens = tokens.index_select(0, &idx);
            rows_on_device = rows_on_device.index_select(0, &idx);
            uniforms.keep_rows(&idx);
            rows = active.iter().map(|&b| rows[b]).collect();
        }
        let nb = rows.len() as i64;
        let step_mask = mask.narrow(1, 0, plen + step as i64 + 1);
        let hidden = model.forward_with(
            &tokens.view([nb, 1]),
            &next_pos.view([nb, 1]),
            &step_mask,
            padding_of(&rows),
            Some(&mut cache),
        );
        logits = model.logits(&hidden.squeeze_dim(1)).to_kind(Kind::Float);
        next_pos += 1;
    }
    // Every log-probability, read back once.
    let logprobs =
        Vec::<f32>::try_from(&logprob_rows.narrow(1, 0, steps as i64).flatten(0, -1)).expect("f32 logprobs");
    for (r, row) in out.iter_mut().enumerate() {
        row.logprobs = logprobs[r * steps..r * steps + row.tokens.len()].to_vec();
        match row.finish {
            Finish::Stop => {}
            // The EOS token is not text, special token or not.
            Finish::Eos => row.text = tokenizer.decode(&row.tokens[..row.tokens.len() - 1]),
            Finish::Length => row.text = tokenizer.decode(&row.tokens),
        }
    }
}

/// Each batch row's uniforms, drawn ahead from its completion's stream and copied to the device
/// [`UNIFORM_CHUNK`] steps at a time (a copy to the device waits as a read does). A row in the
/// batch has drawn one number per step so far, so its number for step s is its stream's s-th,
/// whenever it is drawn.
struct Uniforms {
    /// False when greedy: nothing is drawn.
    sampling: bool,
    /// `[B, chunk]` f64: the batch rows' numbers from `first_step` on.
    chunk: Option<Tensor>,
    first_step: usize,
}

impl Uniforms {
    /// The batch rows' numbers for `step`, `[B]` f64 on `device`.
    fn at(
        &mut self,
        step: usize,
        max_new: usize,
        rows: &[usize],
        rngs: &mut [SamplerRng],
        device: Device,
    ) -> Option<Tensor> {
        if !self.sampling {
            return None;
        }
        let width = self.chunk.as_ref().map_or(0, |c| c.size()[1] as usize);
        if self.chunk.is_none() || step >= self.first_step + width {
            let len = UNIFORM_CHUNK.min(max_new - step);
            let mut values = Vec::with_capacity(rows.len() * len);
            for &r in rows {
                values.extend((0..len).map(|_| rngs[r].next_f64()));
            }
            let shape = [rows.len() as i64, len as i64];
            self.chunk = Some(Tensor::from_slice(&values).view(shape).to_device(device));
            self.first_step = step;
        }
        self.chunk.as_ref().map(|c| c.select(1, (step - self.first_step) as i64))
    }

    /// Keeps the numbers of the batch rows `idx` (a compaction).
    fn keep_rows(&mut self, idx: &Tensor) {
        if let Some(chunk) = &self.chunk {
            self.chunk = Some(chunk.index_select(0, idx));
        }
    }
}

/// Finds stop strings in completions' texts as they grow, decoding only their last tokens: what
/// [`generate`] does after each token.
///
/// The rule is the one a full decode after each token applies: a stop string found in the last
/// `longest stop string + 32` bytes of the text (the start moved back to a character boundary),
/// the match that ends first. A match the newest token completed ends in its text, so it is
/// there unless that token's text is longer than 32 bytes.
///
/// Why the last tokens are enough. Decoding a completion's last tokens gives, once its first
/// character and the U+FFFD right after it are dropped ([`settled_suffix`]), a suffix of the
/// decoding of the whole completion, character for character — for decoders that concatenate
/// the tokens' texts and change only what they start with. Byte-level BPE (GPT-2, Llama 3,
/// Qwen, SmolLM) joins the tokens' bytes and decodes them as UTF-8 with U+FFFD for what is
/// invalid: bytes of a character begun before the window decode as U+FFFD in the window (never
/// as part of the character after them, which starts with a non-continuation byte), and from
/// the first character that starts in the window on, both decodings agree. SentencePiece
/// decoders (`Metaspace`, `Strip`) may drop a leading space, which is the first character;
/// skipped special tokens add nothing either way. So when that suffix holds the last
/// `tail + 3` bytes, the rule gives the same answer on it as on the whole text (the 3: moving
/// the start back to a character boundary). Fewer bytes: twice as many tokens, up to all of
/// them. On a match the whole completion is decoded once, for its text up to the stop string
/// (and the rule applied to it, so a decoder outside these kinds can at worst miss a stop,
/// never invent one).
pub struct StopScan<'a> {
    stops: &'a [String],
    /// How many bytes at the end of the text are searched.
    tail: usize,
    /// Per completion, how many of its last tokens are decoded (grows when too few).
    window: Vec<usize>,
}

impl<'a> StopScan<'a> {
    /// A scan of `completions` completions (numbered from 0) for `stops`.
    pub fn new(stops: &'a [String], completions: usize) -> StopScan<'a> {
        let tail = stops.iter().map(String::len).max().unwrap_or(0) + 32;
        StopScan { stops, tail, window: vec![8; completions] }
    }

    /// When the text of `tokens` (completion `row`'s, one token longer than at the last call)
    /// reaches a stop string: the text up to the end of it.
    pub fn check(&mut self, tokenizer: &Tokenizer, row: usize, tokens: &[i64]) -> Option<String> {
        if self.stops.is_empty() {
            return None;
        }
        loop {
            let start = tokens.len().saturating_sub(self.window[row]);
            let text = tokenizer.decode(&tokens[start..]);
            if start == 0 {
                return self.find(&text).map(|end| text[..end].to_owned());
            }
            let settled = settled_suffix(&text);
            if settled.len() >= self.tail + 3 {
                self.find(settled)?;
                let full = tokenizer.decode(tokens);
                return self.find(&full).map(|end| full[..end].to_owned());
            }
            self.window[row] *= 2;
        }
    }

    /// Where the first stop string found in the last `tail` bytes of `text` ends.
    fn find(&self, text: &str) -> Option<usize> {
        let from = floor_char_boundary(text, text.len().saturating_sub(self.tail));
        self.stops.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i + s.len())).min()
    }
}

/// The decoding of a completion's last tokens without what may differ from the same place in the
/// decoding of the whole completion: its first character, and the U+FFFD after it.
fn settled_suffix(text: &str) -> &str {
    let mut chars = text.chars();
    chars.next();
    chars.as_str().trim_start_matches('\u{FFFD}')
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// How many tokens nucleus sampling ranks at first.
const NUCLEUS_CANDIDATES: i64 = 256;

/// A nucleus whose ranked tokens' mass reaches `top_p` by this much has ended: the mass before
/// any later token is at least that sum less a few ulps (cumulative sums of probabilities ≤ 1 in
/// f64 round by under 2⁻⁵³ each), so no later token is kept.
const NUCLEUS_MARGIN: f64 = 1e-12;

/// Samples each step's tokens and keeps, across steps, how many candidates nucleus sampling
/// ranks.
struct Sampler<'a> {
    params: &'a SamplingParams,
    vocab: i64,
    candidates: i64,
}

impl<'a> Sampler<'a> {
    fn new(params: &'a SamplingParams, vocab: i64) -> Sampler<'a> {
        Sampler { params, vocab, candidates: NUCLEUS_CANDIDATES.min(vocab) }
    }

    /// The step's tokens (on the device, and read back) and their log-probabilities: one read
    /// from the device, another only when a row's nucleus outgrew the candidates.
    fn step(&mut self, logits: &Tensor, uniforms: Option<&Tensor>) -> (Tensor, Tensor, Vec<i64>) {
        loop {
            let (tokens, logprobs) = sample_step(logits, self.params, uniforms, self.candidates);
            let read = Vec::<i64>::try_from(&tokens).expect("int64 tokens");
            if read.iter().all(|&t| t >= 0) {
                return (tokens, logprobs, read);
            }
            self.candidates = (self.candidates * 4).min(self.vocab);
        }
    }
}

/// One token per row from `logits [N, V]` (f32): the token and its log-probability under
/// `log_softmax(logits / T)` (T = 1 for greedy). Nucleus sampling ranks `candidates` tokens and
/// answers −1 for a row whose nucleus may reach past them.
fn sample_step(
    logits: &Tensor,
    params: &SamplingParams,
    uniforms: Option<&Tensor>,
    candidates: i64,
) -> (Tensor, Tensor) {
    if params.temperature == 0.0 {
        let tokens = logits.argmax(-1, false);
        let logprobs =
            logits.log_softmax(-1, Kind::Float).gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
        return (tokens, logprobs);
    }
    let u = uniforms.expect("a uniform per row when sampling");
    let vocab = logits.size()[1];
    let scaled = logits / params.temperature;
    let logp = scaled.log_softmax(-1, Kind::Float);
    let top_k = params.top_k as i64;
    // The candidates, most likely first when filtering, their probabilities, and (nucleus
    // sampling from fewer candidates than the vocabulary) the rows whose nucleus may not fit.
    let (probs, order, unfit) = if top_k > 0 && top_k < vocab {
        let (values, order) = scaled.topk(top_k, -1, true, true);
        let mut probs = values.softmax(-1, Kind::Double);
        if params.top_p < 1.0 {
            probs = nucleus(&probs, params.top_p).0;
        }
        (probs, Some(order), None)
    } else if params.top_p < 1.0 {
        let k = candidates.min(vocab);
        let (values, order) = ranked(&scaled, k);
        let probs = scaled.softmax(-1, Kind::Double).gather(1, &order, false);
        let (probs, cumulative) = nucleus(&probs, params.top_p);
        let unfit = (k < vocab).then(|| {
            // The tokens ranked strictly above the k-th are the vocabulary's; the nucleus must
            // end among them.
            let above = values.gt_tensor(&values.select(1, k - 1).unsqueeze(1)).sum_dim_intlist(
                1,
                false,
                Kind::Int64,
            );
            let last_above = (&above - 1).clamp_min(0).unsqueeze(1);
            let mass = cumulative.gather(1, &last_above, false).squeeze_dim(1);
            above.eq(0).logical_or(&mass.lt(params.top_p + NUCLEUS_MARGIN))
        });
        (probs, Some(order), unfit)
    } else {
        (logp.to_kind(Kind::Double).exp(), None, None)
    };
    // Inverse CDF: the first index whose cumulative mass exceeds u · total.
    let cdf = probs.cumsum(-1, Kind::Double);
    let width = cdf.size()[1];
    let total = cdf.select(1, width - 1);
    let target = (u * &total).unsqueeze(1);
    // Binary search: the number of entries ≤ target (first index whose mass exceeds it).
    let mut idx = target.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(1);
    // u · total rounding up to total would point past the end: take the last token with mass.
    let last = cdf.argmax(-1, false);
    idx = last.where_self(&idx.ge(width), &idx);
    let tokens = match order {
        Some(order) => order.gather(1, &idx.unsqueeze(1), false).squeeze_dim(1),
        None => idx,
    };
    let logprobs = logp.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1);
    let tokens = match unfit {
        Some(unfit) => tokens.masked_fill(&unfit, -1),
        None => tokens,
    };
    (tokens, logprobs)
}

/// The `k` highest of `scaled [N, V]` with their token ids, highest first and equal values in
/// token-id order: the first `k` of a stable descending sort of the whole row.
fn ranked(scaled: &Tensor, k: i64) -> (Tensor, Tensor) {
    if k == scaled.size()[1] {
        return scaled.sort_stable(true, -1, true);
    }
    let (values, ids) = scaled.topk(k, -1, true, true);
    // topk orders equal values as it likes: order them by token id.
    let (ids, by_id) = ids.sort(-1, false);
    let (values, by_value) = values.gather(1, &by_id, false).sort_stable(true, -1, true);
    (values, ids.gather(1, &by_value, false))
}

/// `probs` with the tokens past the nucleus zeroed (a token stays while the mass before it is
/// below `top_p`; the first always stays), and the cumulative sums of `probs`.
fn nucleus(probs: &Tensor, top_p: f64) -> (Tensor, Tensor) {
    let cumulative = probs.cumsum(-1, Kind::Double);
    let before = &cumulative - probs;
    (probs * before.lt(top_p).to_kind(Kind::Double), cumulative)
}
