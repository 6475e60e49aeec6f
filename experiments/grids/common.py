"""Building blocks of the experiment grids (`python -m experiments.experiment --grid=...`)."""
import ml_collections


def cell(name: str, label: str, family: str, config: str, *overrides: str):
    """One run of a grid: `config` plus `--config.<override>` flags ("field=value" strings).

    `family` groups cells into one line of the privacy-utility frontier plot."""
    return ml_collections.ConfigDict(dict(name=name, label=label, family=family, config=config,
                                          overrides=tuple(overrides)))


def grid(dataset: str, cells: list, notes: str = "", schedule_reference: str = ""):
    g = ml_collections.ConfigDict()
    g.dataset = dataset
    g.results_dir = f"results/{dataset}"
    g.runs_dir = f"runs/experiments/{dataset}"
    g.cells = cells
    g.notes = notes
    g.schedule_reference = schedule_reference
    g.grid_file = ""
    return g


# What edp_nlu/configs/snips_clc.py (and atis_clc.py, and default.py) gave every run before the
# heads from the labels' name words and, in private runs, weight averaging became their recipe:
# plain heads (a weight column per label) and the last step's weights. The grids' cells of these
# configs that leave them open ran with them: with_heads_before pins them.
CLC_CONFIGS = ("edp_nlu/configs/snips_clc.py", "edp_nlu/configs/atis_clc.py",
               "edp_nlu/configs/default.py")
CLC_HEADS_BEFORE = ("label_head_dim=0", "label_head_names=vectors", "label_head_correction=False",
                    "private_ema_fraction=-1.0")

# What edp_nlu/configs/snips_clc.py's heads and private weight averaging became: for cells of
# other configs that measure that recipe there.
CLC_NAME_WORD_RECIPE = ("label_head_dim=64", "label_head_names=words",
                        "label_head_correction=True", "private_ema_fraction=0.1")

# The same for edp_nlu/configs/snips_bert.py (and atis_bert.py): plain heads until the heads from
# the MiniLM checkpoint's reading of the labels' names, plus a column per label, became their
# recipe (private and plain runs alike).
BERT_CONFIGS = ("edp_nlu/configs/snips_bert.py", "edp_nlu/configs/atis_bert.py")
BERT_HEADS_BEFORE = ("label_head_dim=0", "label_head_names=vectors",
                     "label_head_correction=False")
BERT_NAME_RECIPE = ("label_head_dim=32", "label_head_names=vectors",
                    "label_head_correction=True")
HEADS_BEFORE = {**dict.fromkeys(CLC_CONFIGS, CLC_HEADS_BEFORE),
                **dict.fromkeys(BERT_CONFIGS, BERT_HEADS_BEFORE)}


def with_heads_before(g: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Grid `g` with each cell of a CLC or BERT config given the heads (and averaging) its
    config had before (HEADS_BEFORE) for the fields it leaves open, so that its command still
    runs what it ran."""
    for c in g.cells:
        if c.config in HEADS_BEFORE:
            given = {o.partition("=")[0] for o in c.overrides}
            c.overrides = tuple(c.overrides) + tuple(
                p for p in HEADS_BEFORE[c.config] if p.partition("=")[0] not in given)
    return g


# What edp_nlu/configs/snips_bert.py (and atis_bert.py) gave private runs before their private
# recipe became LoRA r 8 without dropout at Adam 5e-3, and so what the grids' cells that leave it
# open ran with:
# every kernel but the embedding tables trained, dropout 0.1, Adam 2e-3.
BERT_FULL_FINETUNING = ("bert.private_finetune=no_embeddings", "bert.private_dropout=0.1",
                        "private_learning_rate=0.002")


# The LoRA layout (Keras' per_head) the grids' LoRA cells that leave it open ran with: bert_private
# pins it on them.
LORA_LAYOUT_BEFORE = "per_head"


def bert_private(*overrides: str) -> tuple:
    """`overrides` of a private BERT cell, pinned so that the dataset config's private recipe
    cannot change it: bert.finetune / bert.dropout become their private_ fields (which win in
    private runs), whatever the cell leaves open is BERT_FULL_FINETUNING, and a LoRA cell that
    leaves its layout open gets LORA_LAYOUT_BEFORE."""
    pinned = tuple(o.replace("bert.finetune=", "bert.private_finetune=", 1)
                   .replace("bert.dropout=", "bert.private_dropout=", 1)
                   if o.startswith(("bert.finetune=", "bert.dropout=")) else o
                   for o in overrides)
    given = {o.partition("=")[0] for o in pinned}
    if "bert.private_finetune=lora" in pinned and "bert.lora_layout" not in given:
        pinned += (f"bert.lora_layout={LORA_LAYOUT_BEFORE}",)
    return pinned + tuple(p for p in BERT_FULL_FINETUNING if p.partition("=")[0] not in given)

# Why the BERT eDP cells of both grids are left out (the numbers are in the note below): the paper's
# mechanism at an honest epsilon sums 2 clipped vectors a step against noise calibrated to the
# expected batch (358 on ATIS), as the CLC rows of both grids show to the end (results/snips,
# results/atis); eDP with micro-batches of 2 costs about what per-example clipping costs and lost to
# it on CLC in both grids.
EDP_BERT_LEFT_OUT = (
    "bert_edp_paper_eps8 and bert_edp_k2_eps8 are left out on the 2-core CPU: "
    "ATIS's bert_edp_paper_eps8 ran 2 of 24 epochs (1,254 s and 589 s on a shared CPU; about 3 "
    "hours alone for the run, SNIPS's three times that) and stood at dev SER 2.51, intent "
    "accuracy 0.712 (the majority intent's share), slot F1 0.009 when stopped; the CLC rows of "
    "both mechanisms ran to the end (experiments/grids/common.py EDP_BERT_LEFT_OUT).")
