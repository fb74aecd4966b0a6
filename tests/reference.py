"""Slow, direct reference computations of the losses, one term at a time: what each equation the
methods implement is checked against numerically."""

from __future__ import annotations

import math


def slow_info_nce(z1, z2, tau, negatives=None):
    """Gao et al. (2021) Eq. 1, one term at a time with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n = z1.shape[0]
    cols = [z2[j] for j in range(n)] + ([negatives[k] for k in range(negatives.shape[0])] if negatives is not None else [])
    total = 0.0
    for i in range(n):
        num = math.exp(cos(z1[i], z2[i]) / tau)
        den = sum(math.exp(cos(z1[i], c) / tau) for c in cols)
        total += -math.log(num / den)
    return total / n


def slow_hince(z1, z2, z3, t1, t2, w=1.0, valid=None):
    """HiNCE (Cai et al., Eq. 2) term by term with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n, total = len(z1), 0.0
    for i in range(n):
        terms = [math.exp(cos(z1[i], z2[j]) / t1) for j in range(n)]
        terms += [(w if j == i else 1.0) * math.exp(cos(z1[i], z3[j]) / t2) for j in range(n) if valid is None or valid[j]]
        total += -math.log(math.exp(cos(z1[i], z2[i]) / t1) / sum(terms))
    return total / n


def slow_neighbourhood_loss(q, p, negs, tau):
    """VaSCL's neighbourhood loss (Zhang et al., Eq. 2) one instance at a time with explicit dot
    products of unit vectors."""
    total = 0.0
    for i in range(len(q)):
        pos = math.exp(float(q[i] @ p[i]) / tau)
        den = pos + sum(math.exp(float(q[i] @ n) / tau) for n in negs[i])
        total += -math.log(pos / den)
    return total / len(q)


def slow_nt_xent(rows, partner, tau):
    """NT-Xent (SimCLR, Eq. 1): row i against every other row, its positive ``partner[i]``."""
    import torch

    total = 0.0
    for i, zi in enumerate(rows):
        sims = [float(torch.nn.functional.cosine_similarity(zi, zj, dim=0)) / tau for zj in rows]
        den = sum(math.exp(v) for j, v in enumerate(sims) if j != i)
        total += -(sims[partner[i]] - math.log(den))
    return total / len(rows)


# ------------------------------------------------------------------------------------------------
# The prompt-based recipes: direct ports of the authors' code, row by row


def authors_template(spec: str, tokenizer, roberta: bool = False) -> tuple[str, str]:
    """PromptBERT's and CoT-BERT's ``train.py``: a ``*cls*_..._*sent_0*_..._*sep+*`` template to
    its (bs, es) strings."""
    template = (spec.replace("*mask*", tokenizer.mask_token).replace("*sep+*", "").replace("*cls*", "")
                .replace("*sent_0*", " "))
    bs, es = (part.replace("_", " ") for part in template.split(" "))
    return (bs.strip() if roberta else bs), es


def authors_prompt_ids(tokenizer, sentence: str, bs: str, es: str, max_len: int) -> list[int]:
    """PromptBERT's ``prepare_features`` (CoT-BERT's is the same): ``bs + s[:max_len] + es``."""
    s = tokenizer.encode(sentence, add_special_tokens=False)[:max_len]
    return tokenizer.encode(bs)[:-1] + s + tokenizer.encode(es)[1:]


def sncse_ids(tokenizer, sentence: str, prefix: str, suffix: str, max_seq_length: int) -> list[int]:
    """SNCSE's ``prepare_features`` (BERT): " ." after a sentence without final punctuation, its
    tokens cut to what the template leaves of ``max_seq_length``."""
    import string

    s1 = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(prefix))
    s2 = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(suffix))
    if sentence.strip()[-1] not in list(string.punctuation):
        sentence = sentence + " ."
    tokens = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(sentence))[: max_seq_length - len(s1) - len(s2) - 2]
    return [tokenizer.cls_token_id] + s1 + tokens + s2 + [tokenizer.sep_token_id]


def promptbert_delta(backbone, tokenizer, bs: str, es: str, length: int, anchor_bs: str | None = None):
    """PromptBERT's ``get_delta``: the template alone, ``length`` rows, positions after the prefix
    shifted by the row's index; the [MASK] state of each row. The prefix is ``cls.bs``, the
    anchor's, for every template (``anchor_bs``; default ``bs``)."""
    import torch

    prefix = tokenizer.encode(anchor_bs if anchor_bs is not None else bs, add_special_tokens=False)
    template = tokenizer.encode(bs + es)
    ids = torch.tensor([template] * length)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).repeat(length, 1)
    positions[:, len(prefix) + 1:] += torch.arange(length).unsqueeze(-1)
    hidden = backbone(input_ids=ids, position_ids=positions, return_dict=True).last_hidden_state
    return hidden[ids == tokenizer.mask_token_id]


def cotbert_noise(backbone, tokenizer, bs: str, es: str, total_length: int, mask_num: int):
    """CoT-BERT's ``denoising``: the template around i [PAD]s (attended) for i in 0..total_length -
    len(template), padded to ``total_length``; the state at the last of ``mask_num`` masks."""
    import torch

    b = tokenizer.encode(bs, add_special_tokens=False)
    e = tokenizer.encode(es, add_special_tokens=False)
    template = tokenizer.encode(bs + es)
    pad = tokenizer.pad_token_id
    ids, mask = [], []
    for i in range(total_length - len(template) + 1):
        ids.append([template[0]] + b + [pad] * i + e + [template[-1]] + [pad] * (total_length - len(template) - i))
        mask.append([1] * (len(template) + i) + [0] * (total_length - len(template) - i))
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    hidden = backbone(input_ids=ids, attention_mask=mask, return_dict=True).last_hidden_state
    return hidden[ids == tokenizer.mask_token_id].view(-1, mask_num, hidden.shape[-1])[:, mask_num - 1]


def convert_to_negation(parser, sentence: str) -> str:
    """SNCSE's ``generate_soft_negative_samples.py``, as the authors wrote it."""
    special_words = ["am", "is", "was", "are", "were", "can", "could", "will", "would", "shall", "should", "may",
                     "must", "might"]
    parsed = parser(sentence)
    tokens = [str(_) for _ in parsed]
    deps = [_.dep_ for _ in parsed]
    tags = [_.tag_ for _ in parsed]
    lemmas = [_.lemma_ for _ in parsed]
    if "not" in tokens:
        index = tokens.index("not")
        del tokens[index]
        return " ".join(tokens)
    flag = 0
    for dep in deps:
        if dep == "aux" or dep == "auxpass":
            flag = 1
            break
        if dep == "ROOT":
            flag = 2
            break
    if flag == 1:
        for i, dep in enumerate(deps):
            if dep == "aux" or dep == "auxpass":
                tokens[i] += " not"
                break
    elif flag == 2:
        index = deps.index("ROOT")
        if tokens[index].lower() in special_words:
            tokens[index] += " not"
        elif tags[index] == "VBP":
            tokens[index] = "do not " + lemmas[index]
        elif tags[index] == "VBZ":
            tokens[index] = "does not " + lemmas[index]
        elif tags[index] == "VBD":
            tokens[index] = "did not " + lemmas[index]
        else:
            tokens.insert(0, "Not")
    else:
        tokens.insert(0, "Not")
    return " ".join(tokens)


def slow_bml(z1, z2, z3, alpha, beta):
    """SNCSE's bidirectional margin loss, row by row with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    terms = []
    for i in range(len(z1)):
        d = cos(z1[i], z3[i]) - cos(z1[i], z2[i])
        terms.append(max(0.0, d + alpha) + max(0.0, -d - beta))
    return sum(terms) / len(terms)


def slow_cot(z1, z2, z3, tau, positive_negatives=True, valid=None):
    """CoT-BERT Eq. 3 term by term: -log a_ii+ / sum_j (a_ij+ + a_ij- + a_i+j-)."""
    def a(x, y):
        return math.exp(float(x @ y) / (math.sqrt(float(x @ x)) * math.sqrt(float(y @ y))) / tau)

    n, total = len(z1), 0.0
    negatives = [j for j in range(len(z3)) if valid is None or bool(valid[j])]
    for i in range(n):
        den = sum(a(z1[i], z2[j]) for j in range(n)) + sum(a(z1[i], z3[j]) for j in negatives)
        if positive_negatives:
            den += sum(a(z2[i], z3[j]) for j in negatives)
        total += -math.log(a(z1[i], z2[i]) / den)
    return total / n


# ------------------------------------------------------------------------------------------------
# The prompt recipes' evaluation, as each author's evaluation scripts do it

# The anchor template each author's test script fills, as the script writes it (SNCSE's with {} for the sentence).
TEST_SPECS = {
    ("promptbert", "bert"): '*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*',
    ("promptbert", "roberta"): "*cls*_This_sentence_:_'_*sent_0*_'_means*mask*.*sep+*",
    ("cotbert", "bert"): '*cls*_The_sentence_of_"*sent_0*"_means_*mask*_,_so_it_can_be_summarized_as_*mask*_._*sep+*',
    ("cotbert", "roberta"): "*cls*_The_sentence_of_'_*sent_0*_'_means_*mask*_,_so_it_can_be_summarized_as_*mask*_._*sep+*",
    ("sncse", "bert"): 'This sentence : " {} " means [MASK] .',
    ("sncse", "roberta"): 'This sentence : " {} " means [MASK] .',
}
MASKS = {"promptbert": 1, "cotbert": 2, "sncse": 1}


def authors_test_text(recipe: str, spec: str, sentence: str, mask_token: str) -> str:
    """The string the authors' test script tokenises for one SentEval sentence (its words joined
    by spaces). PromptBERT's and CoT-BERT's ``evaluation.py`` batcher: the ``*cls*_..._*sep+*``
    template with ``_`` as spaces, "." after a sentence not ending in one of ``.?"'``, the filled
    string stripped. SNCSE's ``*_prediction.py``: " ." after a sentence whose stripped last
    character is not in ``string.punctuation``, then ``spec`` (``prefix{}suffix``) filled as is."""
    import string

    if recipe == "sncse":
        if sentence.strip()[-1] not in list(string.punctuation):
            sentence = sentence + " ."
        return spec.replace("[MASK]", mask_token).format(sentence)
    template = spec.replace("*mask*", mask_token).replace("_", " ").replace("*sep+*", "").replace("*cls*", "")
    if len(sentence) > 0 and sentence[-1] not in '.?"\'':
        sentence += "."
    return template.replace("*sent 0*", sentence).strip()


def authors_mask_rows(tokenizer, texts: list[str], mask_num: int = 1) -> tuple[dict, list[int]]:
    """The texts tokenised as one batch (``batch_encode_plus``, padding) and the position of the
    embedding mask in each row: ``last_hidden[input_ids == mask_token_id]`` viewed as ``(-1,
    mask_num, d)``, its last (PromptBERT: one mask; CoT-BERT: ``[:, mask_num - 1]``)."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)  # batch_encode_plus, which transformers 5 dropped
    positions, mask_id = [], tokenizer.mask_token_id
    for row in batch["input_ids"].tolist():
        masks = [i for i, t in enumerate(row) if t == mask_id]
        assert len(masks) == mask_num, (row, masks)
        positions.append(masks[mask_num - 1])
    return batch, positions


def authors_sts_scores(model, tokenizer, recipe: str, spec: str, tasks: dict, mask_num: int = 1,
                       batch_size: int = 64) -> dict[str, float]:
    """SentEval's STS protocol with the authors' batcher, re-derived with plain transformers: each
    task's pairs embedded as the authors' test script does (``authors_test_text``, one-string
    tokens, the mask's last-layer state, no denoising), cosine, Spearman x100 over all of a task's
    pairs (``tasks``: ``{task: (sent1, sent2, gold)}``)."""
    import numpy as np
    import torch
    from scipy.stats import spearmanr

    def embed(sentences):
        out = []
        for start in range(0, len(sentences), batch_size):
            texts = [authors_test_text(recipe, spec, s, tokenizer.mask_token) for s in sentences[start:start + batch_size]]
            batch, positions = authors_mask_rows(tokenizer, texts, mask_num)
            with torch.no_grad():
                hidden = model(**batch, output_hidden_states=True, return_dict=True).last_hidden_state
            out.append(hidden[torch.arange(len(texts)), torch.tensor(positions)])
        return torch.cat(out)

    model.eval()
    scores = {}
    for task, (sent1, sent2, gold) in tasks.items():
        a, b = embed(list(sent1)), embed(list(sent2))
        sims = [float(torch.nn.functional.cosine_similarity(x, y, dim=0)) for x, y in zip(a, b)]
        scores[task] = float(spearmanr(sims, np.asarray(gold)).statistic * 100)
    return scores


def promptbert_dev_embeddings(model, tokenizer, bs: str, es: str, sentences: list[str]):
    """PromptBERT's ``CLTrainer.evaluate`` with ``sentemb_forward`` (``--mask_embedding_sentence_delta``,
    no ``..._no_delta_eval``, ``--mlp_only_train``), one sentence at a time: the sentence
    tokenised plainly, its ids put between ``bs`` and ``es``; the template alone encoded for 128
    lengths, positions after ``len(bs) + 1`` shifted by the length, in eval mode without gradient;
    the [MASK] state minus ``delta[attention_mask.sum() - template_len]``."""
    import torch

    model.eval()
    prefix = tokenizer.encode(bs, add_special_tokens=False)
    suffix = tokenizer.encode(es, add_special_tokens=False)
    template = tokenizer.encode(bs + es)
    with torch.no_grad():
        d_ids = torch.tensor([template]).repeat(128, 1)
        d_positions = torch.arange(d_ids.shape[1]).unsqueeze(0).repeat(128, 1)
        d_positions[:, len(prefix) + 1:] += torch.arange(128).unsqueeze(-1)
        hidden = model(input_ids=d_ids, position_ids=d_positions, return_dict=True).last_hidden_state
        delta = hidden[d_ids == tokenizer.mask_token_id]
        out = []
        for sentence in sentences:
            ids = tokenizer.encode(sentence)
            row = [ids[0]] + prefix + ids[1:-1] + suffix + [ids[-1]]
            state = model(input_ids=torch.tensor([row]), return_dict=True).last_hidden_state[0]
            out.append(state[row.index(tokenizer.mask_token_id)] - delta[len(row) - len(template)])
    return torch.stack(out)
