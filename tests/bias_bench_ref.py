"""A faithful transcription of bias-bench's debiasing code, the reference of tests/test_lm_debias.py.

Source: https://github.com/McGill-NLP/bias-bench, commit 291426aab926f78ecfc7bd040b531429ee8123e0
(the repository has no licence file at this commit: this transcription is kept under tests/ only,
for cross-checking, and is not part of the package; see docs/mitigation.md). bias-bench cannot be imported as-is (it imports
``transformers.generation_utils``, removed from current transformers, moves models to CUDA, and
reads its data from a ``persistent_dir``), so the functions below are copied from these files with
only the changes listed in each docstring (module state such as ``self._model`` passed as
arguments, ``device`` fixed to CPU, tqdm removed, ``tokenizer.batch_encode_plus(...)`` written
``tokenizer(...)``: transformers 5 removed the former, the latter is its documented equivalent).
Nothing here is biasaudit code.

* ``bias_bench/debias/inlp/debias.py``: get_rowspace_projection,
  get_projection_to_intersection_of_nullspaces, get_debiasing_projection;
  ``bias_bench/debias/inlp/classifier.py``: SKlearnClassifier;
  ``bias_bench/debias/inlp/context_nullspace_projection.py``: _split_gender_dataset,
  _apply_nullspace_projection (with input_dim passed instead of 768), _extract_gender_features;
* ``bias_bench/dataset/sentence_debias.py``: _gender_augment_func, _race_augment_func (also
  bias-bench's _religion_augment_func, identical), _replace_word_in_text;
* ``bias_bench/dataset/inlp.py``: load_inlp_data + _load_gender_data, _load_race_data (also
  _load_religion_data, identical) (lines and attribute words passed in);
* ``bias_bench/debias/sentence_debias.py``: compute_gender_subspace, compute_race_subspace (also
  compute_religion_subspace, identical);
* ``experiments/run_mlm.py``: _create_bias_attribute_words (reading a dict instead of the file),
  the word-level loops of gender_counterfactual_augmentation and
  ternary_counterfactual_augmentation (on decoded text, without the tokenizer round trip);
* ``bias_bench/debias/self_debias/generation.py``: SelfDebiasingLogitsProcessor (debug output
  removed); ``modeling.py``: GPT2Wrapper.compute_loss_self_debiasing,
  MaskedLMWrapper.get_token_logits_self_debiasing, GPT2Wrapper.generate_self_debiasing (greedy,
  with SelfDebiasingGPT2LMHeadModel.greedy_search's loop).
"""
# flake8: noqa
from typing import List

import numpy as np
import scipy
import scipy.linalg
import sklearn
import sklearn.model_selection
import torch
from sklearn.decomposition import PCA
from sklearn.svm import LinearSVC

device = torch.device("cpu")


# ---------------------------------------------------------------- inlp/classifier.py
class SKlearnClassifier(object):
    def __init__(self, m):
        self.model = m

    def train_network(self, X_train, Y_train, X_dev, Y_dev):
        self.model.fit(X_train, Y_train)
        score = self.model.score(X_dev, Y_dev)
        return score

    def get_weights(self):
        w = self.model.coef_
        if len(w.shape) == 1:
            w = np.expand_dims(w, 0)
        return w


# ---------------------------------------------------------------- inlp/debias.py
def get_rowspace_projection(W: np.ndarray) -> np.ndarray:
    if np.allclose(W, 0):
        w_basis = np.zeros_like(W.T)
    else:
        w_basis = scipy.linalg.orth(W.T)  # Orthogonal basis

    P_W = w_basis.dot(w_basis.T)  # Orthogonal projection on W's rowspace

    return P_W


def get_projection_to_intersection_of_nullspaces(rowspace_projection_matrices: List[np.ndarray], input_dim: int):
    I = np.eye(input_dim)
    Q = np.sum(rowspace_projection_matrices, axis=0)
    P = I - get_rowspace_projection(Q)

    return P


def get_debiasing_projection(classifier_class, cls_params, num_classifiers, input_dim, is_autoregressive,
                             min_accuracy, X_train, Y_train, X_dev, Y_dev, by_class=False, Y_train_main=None,
                             Y_dev_main=None, dropout_rate=0):
    I = np.eye(input_dim)

    X_train_cp = X_train.copy()
    X_dev_cp = X_dev.copy()
    rowspace_projections = []
    Ws = []

    for i in range(num_classifiers):

        clf = SKlearnClassifier(classifier_class(**cls_params))
        dropout_scale = 1.0 / (1 - dropout_rate + 1e-6)
        dropout_mask = (np.random.rand(*X_train.shape) < (1 - dropout_rate)).astype(float) * dropout_scale

        relevant_idx_train = np.ones(X_train_cp.shape[0], dtype=bool)
        relevant_idx_dev = np.ones(X_dev_cp.shape[0], dtype=bool)

        acc = clf.train_network(
            (X_train_cp * dropout_mask)[relevant_idx_train],
            Y_train[relevant_idx_train],
            X_dev_cp[relevant_idx_dev],
            Y_dev[relevant_idx_dev],
        )
        if acc < min_accuracy:
            continue

        W = clf.get_weights()
        Ws.append(W)
        P_rowspace_wi = get_rowspace_projection(W)  # projection to W's rowspace
        rowspace_projections.append(P_rowspace_wi)

        if is_autoregressive:
            P = get_projection_to_intersection_of_nullspaces(rowspace_projections, input_dim)
            X_train_cp = (P.dot(X_train.T)).T
            X_dev_cp = (P.dot(X_dev.T)).T

    P = get_projection_to_intersection_of_nullspaces(rowspace_projections, input_dim)

    return P, rowspace_projections, Ws


# ---------------------------------------------------------------- inlp/context_nullspace_projection.py
def _extract_gender_features(model, tokenizer, male_sentences, female_sentences, neutral_sentences):
    model.to(device)
    male_features = []
    female_features = []
    neutral_features = []
    with torch.no_grad():
        for sentence in male_sentences:
            input_ids = tokenizer(sentence, add_special_tokens=True, truncation=True, return_tensors="pt").to(device)
            outputs = model(**input_ids)["last_hidden_state"]
            outputs = torch.mean(outputs, dim=1)
            outputs = outputs.squeeze().detach().cpu().numpy()
            male_features.append(outputs)
        for sentence in female_sentences:
            input_ids = tokenizer(sentence, add_special_tokens=True, truncation=True, return_tensors="pt").to(device)
            outputs = model(**input_ids)["last_hidden_state"]
            outputs = torch.mean(outputs, dim=1)
            outputs = outputs.squeeze().detach().cpu().numpy()
            female_features.append(outputs)
        for sentence in neutral_sentences:
            input_ids = tokenizer(sentence, add_special_tokens=True, truncation=True, return_tensors="pt").to(device)
            outputs = model(**input_ids)["last_hidden_state"]
            outputs = torch.mean(outputs, dim=1)
            outputs = outputs.squeeze().detach().cpu().numpy()
            neutral_features.append(outputs)
    male_features = np.array(male_features)
    female_features = np.array(female_features)
    neutral_features = np.array(neutral_features)
    return male_features, female_features, neutral_features


def _split_gender_dataset(male_feat, female_feat, neut_feat):
    np.random.seed(0)

    X = np.concatenate((male_feat, female_feat, neut_feat), axis=0)

    y_male = np.ones(male_feat.shape[0], dtype=int)
    y_female = np.zeros(female_feat.shape[0], dtype=int)
    y_neutral = -np.ones(neut_feat.shape[0], dtype=int)

    y = np.concatenate((y_male, y_female, y_neutral))

    X_train_dev, X_test, y_train_dev, Y_test = sklearn.model_selection.train_test_split(
        X, y, test_size=0.3, random_state=0
    )
    X_train, X_dev, Y_train, Y_dev = sklearn.model_selection.train_test_split(
        X_train_dev, y_train_dev, test_size=0.3, random_state=0
    )

    return X_train, X_dev, X_test, Y_train, Y_dev, Y_test


def _apply_nullspace_projection(X_train, X_dev, X_test, Y_train, Y_dev, Y_test, n_classifiers=80, input_dim=768):
    classifier_parameters = {
        "fit_intercept": False,
        "class_weight": None,
        "dual": False,
        "random_state": 0,
    }

    P, rowspace_projs, Ws = get_debiasing_projection(
        classifier_class=LinearSVC,
        cls_params=classifier_parameters,
        num_classifiers=n_classifiers,
        input_dim=input_dim,
        is_autoregressive=True,
        min_accuracy=0,
        X_train=X_train,
        Y_train=Y_train,
        X_dev=X_dev,
        Y_dev=Y_dev,
        Y_train_main=None,
        Y_dev_main=None,
        by_class=False,
        dropout_rate=0,
    )

    return P, rowspace_projs, Ws


# ---------------------------------------------------------------- dataset/sentence_debias.py
def _gender_augment_func(text, examples, attribute_words):
    words = text.split(" ")

    for i, (female_word, male_word) in enumerate(attribute_words):
        if female_word in words:
            female_example = text
            male_example = _replace_word_in_text(female_word, male_word, words)
            examples.append({"female_example": female_example, "male_example": male_example})

        if male_word in words:
            female_example = _replace_word_in_text(male_word, female_word, words)
            male_example = text
            examples.append({"female_example": female_example, "male_example": male_example})

    return examples


def _replace_word_in_text(word_to_replace, new_word, words):
    return " ".join([new_word if word == word_to_replace else word for word in words])


def generic_load_examples(lines, attribute_words):
    """_GenericDataset.load_examples, with nltk.sent_tokenize replaced by one sentence per line."""
    examples = []
    data = []
    for line in lines:
        line = line.lower()
        data.extend([line])
    for sentence in data:
        sentence = sentence.lower()
        sentence = sentence.strip()
        examples = _gender_augment_func(sentence, examples, attribute_words)
    return examples


# ---------------------------------------------------------------- debias/sentence_debias.py
def compute_gender_subspace(data, model, tokenizer, batch_size=32):
    model.to(device)

    all_embeddings_male = []
    all_embeddings_female = []

    n_batches = len(data) // batch_size
    for i in range(n_batches):
        offset = batch_size * i

        inputs_male = tokenizer(
            [example["male_example"] for example in data[offset : offset + batch_size]],
            return_tensors="pt",
            truncation=True,
            padding="max_length",
            max_length=128,
        )

        inputs_female = tokenizer(
            [example["female_example"] for example in data[offset : offset + batch_size]],
            return_tensors="pt",
            truncation=True,
            padding="max_length",
            max_length=128,
        )

        male_input_ids = inputs_male["input_ids"].to(device)
        female_input_ids = inputs_female["input_ids"].to(device)

        male_attention_mask = inputs_male["attention_mask"].to(device)
        female_attention_mask = inputs_female["attention_mask"].to(device)

        with torch.no_grad():
            embedding_male = model(input_ids=male_input_ids, attention_mask=male_attention_mask)["last_hidden_state"]
            embedding_male *= male_attention_mask.unsqueeze(-1)
            embedding_male = embedding_male.sum(dim=1)
            embedding_male /= male_attention_mask.sum(dim=1, keepdims=True)

            embedding_female = model(input_ids=female_input_ids, attention_mask=female_attention_mask)[
                "last_hidden_state"
            ]
            embedding_female *= female_attention_mask.unsqueeze(-1)
            embedding_female = embedding_female.sum(dim=1)
            embedding_female /= female_attention_mask.sum(dim=1, keepdims=True)

        embedding_male /= torch.norm(embedding_male, dim=-1, keepdim=True)
        embedding_female /= torch.norm(embedding_female, dim=-1, keepdim=True)

        all_embeddings_male.append(embedding_male.cpu().numpy())
        all_embeddings_female.append(embedding_female.cpu().numpy())

    all_embeddings_male = np.concatenate(all_embeddings_male, axis=0)
    all_embeddings_female = np.concatenate(all_embeddings_female, axis=0)

    means = (all_embeddings_male + all_embeddings_female) / 2.0
    all_embeddings_male -= means
    all_embeddings_female -= means

    all_embeddings = np.concatenate([all_embeddings_male, all_embeddings_female], axis=0)

    pca = PCA(n_components=1)
    pca.fit(all_embeddings)

    bias_direction = torch.tensor(pca.components_[0], dtype=torch.float32)

    return bias_direction


def sentence_debias_hook_apply(x, bias_direction):
    """models.py _SentenceDebiasModel._hook, on the last hidden state ``x`` (batch, seq, dim)."""
    for t in range(x.size(1)):
        x[:, t] = x[:, t] - torch.ger(torch.matmul(x[:, t], bias_direction), bias_direction) / bias_direction.dot(
            bias_direction
        )
    return x


# ---------------------------------------------------------------- experiments/run_mlm.py
def _create_bias_attribute_words(attribute_words_json, bias_type):
    bias_attribute_words = attribute_words_json[bias_type]

    result = bias_attribute_words[:]
    for punctuation in [".", ",", "?", "!", ";", ":"]:
        for words in bias_attribute_words:
            augmented_words = [word + punctuation for word in words]
            result.append(augmented_words)
    return result


def gender_counterfactual_augmentation_text(sentences, bias_attribute_words):
    """gender_counterfactual_augmentation with ``sentence = tokenizer.decode(input_ids)`` replaced
    by the decoded sentences themselves, returning the texts it would re-tokenise."""
    outputs = []
    for sentence in sentences:
        words = sentence.split()  # Tokenize based on whitespace.
        augmented_sentence = words[:]

        augmented = False
        for position, word in enumerate(words):
            for male_word, female_word in bias_attribute_words:
                if male_word == word:
                    augmented = True
                    augmented_sentence[position] = female_word

                if female_word == word:
                    augmented = True
                    augmented_sentence[position] = male_word

        if augmented:
            augmented_sentence = " ".join(augmented_sentence)
            outputs.append(augmented_sentence)
            outputs.append(sentence)
    return outputs


# ---------------------------------------------------------------- self_debias/generation.py
class SelfDebiasingLogitsProcessor:
    def __init__(self, num_debiasing_prefixes, decay_constant=50, epsilon=0.01, debug=False, tokenizer=None):
        self.num_debiasing_prefixes = num_debiasing_prefixes
        self.decay_constant = decay_constant
        self.epsilon = epsilon
        self.debug = debug
        self.tokenizer = tokenizer

    def __call__(self, input_ids, scores):
        batch_size = scores.shape[0] // (1 + self.num_debiasing_prefixes)
        regular_sentence_indices = range(batch_size)
        for regular_sentence_idx in regular_sentence_indices:
            bias_indices = self._get_bias_indices(regular_sentence_idx, batch_size)
            if bias_indices:
                self._debias_scores(scores, regular_sentence_idx, bias_indices)
        return scores

    def _get_bias_indices(self, regular_sentence_idx, batch_size):
        return [
            regular_sentence_idx + (prefix_idx + 1) * batch_size for prefix_idx in range(self.num_debiasing_prefixes)
        ]

    def _debias_scores(self, scores, regular_sent_idx, bias_indices):
        logits_biased = [scores[bias_idx] for bias_idx in bias_indices]

        mask = self._generate_decay_mask(scores[regular_sent_idx], logits_biased)
        scores[regular_sent_idx] = torch.log(self._apply_decay_mask(scores[regular_sent_idx], mask))

        for debiasing_sent_idx in bias_indices:
            scores[debiasing_sent_idx] = scores[regular_sent_idx]

    def _apply_decay_mask(self, logits, decay_mask):
        probabilities = logits.softmax(dim=-1)
        decay_mask = torch.exp(-decay_mask * self.decay_constant)
        decay_mask = torch.max(decay_mask, torch.tensor([self.epsilon], device=decay_mask.device))
        probabilities = probabilities * decay_mask
        probabilities = probabilities / probabilities.sum(dim=-1)
        return probabilities

    def _generate_decay_mask(self, logits_regular, logits_biased_list):
        p_regular = logits_regular.softmax(dim=-1)
        p_biased = None

        for logits_biased in logits_biased_list:
            if p_biased is None:
                p_biased = logits_biased.softmax(dim=-1)
            else:
                p_biased = torch.max(p_biased, logits_biased.softmax(dim=-1))

        mask = torch.max(p_biased - p_regular, torch.tensor([0.0], device=p_regular.device))

        return mask


# ---------------------------------------------------------------- self_debias/modeling.py
def gpt2_compute_loss_self_debiasing(model, tokenizer, input_ids, debiasing_prefixes, decay_constant=50,
                                     epsilon=0.01, debug=False):
    """GPT2Wrapper.compute_loss_self_debiasing (self._model/_tokenizer passed; the wrapper sets
    tokenizer.pad_token = eos_token in its constructor, done here on a copy)."""
    logits_processor = SelfDebiasingLogitsProcessor(
        num_debiasing_prefixes=len(debiasing_prefixes), decay_constant=decay_constant, epsilon=epsilon,
        debug=debug, tokenizer=tokenizer,
    )

    input_prefixes = [""] + debiasing_prefixes
    input_prefixes = tokenizer(input_prefixes, padding=True, return_tensors="pt")
    input_prefixes["attention_mask"] = torch.flip(input_prefixes["attention_mask"], dims=[1])

    shifts = input_prefixes["attention_mask"].shape[-1] - input_prefixes["attention_mask"].sum(dim=-1)
    for batch_idx in range(input_prefixes["input_ids"].shape[0]):
        input_prefixes["input_ids"][batch_idx] = input_prefixes["input_ids"][batch_idx].roll(shifts[batch_idx].item())

    input_prefixes = {k: v.to(device) for k, v in input_prefixes.items()}

    input_ids_repeated = input_ids.repeat(len(debiasing_prefixes) + 1, 1)
    attention_mask = torch.ones_like(input_ids_repeated)

    attention_mask = torch.cat([input_prefixes["attention_mask"], attention_mask], dim=-1)
    input_ids_repeated = torch.cat([input_prefixes["input_ids"], input_ids_repeated], dim=-1)

    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)

    outputs = model(input_ids=input_ids_repeated, attention_mask=attention_mask, position_ids=position_ids)
    lm_logits = outputs["logits"]

    for idx in range(lm_logits.shape[1]):
        lm_logits[:, idx, :] = logits_processor(input_ids=None, scores=lm_logits[:, idx, :])

    return lm_logits, input_ids_repeated


def mlm_get_token_logits_self_debiasing(model, tokenizer, input_ids, debiasing_prefixes, decay_constant=50,
                                        epsilon=0.01):
    """MaskedLMWrapper.get_token_logits_self_debiasing (self._model/_tokenizer passed; BERT only)."""
    assert input_ids.shape[0] == 1

    logits_processor = SelfDebiasingLogitsProcessor(
        num_debiasing_prefixes=len(debiasing_prefixes), decay_constant=decay_constant, epsilon=epsilon,
        tokenizer=tokenizer,
    )

    input_prefixes = [tokenizer.cls_token] + [" ".join([tokenizer.cls_token, dp]) for dp in debiasing_prefixes]

    input_prefixes = tokenizer(input_prefixes, padding=True, return_tensors="pt",
                                                 add_special_tokens=False)
    input_prefixes["attention_mask"] = torch.flip(input_prefixes["attention_mask"], dims=[1])

    input_ids = input_ids[:, 1:]

    shifts = input_prefixes["attention_mask"].shape[-1] - input_prefixes["attention_mask"].sum(dim=-1)
    for batch_idx in range(input_prefixes["input_ids"].shape[0]):
        input_prefixes["input_ids"][batch_idx] = input_prefixes["input_ids"][batch_idx].roll(shifts[batch_idx].item())

    input_prefixes = {k: v.to(device) for k, v in input_prefixes.items()}

    input_ids_repeated = input_ids.repeat(len(debiasing_prefixes) + 1, 1)
    attention_mask = torch.ones_like(input_ids_repeated)

    attention_mask = torch.cat([input_prefixes["attention_mask"], attention_mask], dim=-1)
    input_ids_repeated = torch.cat([input_prefixes["input_ids"], input_ids_repeated], dim=-1)

    mask_positions = input_ids_repeated == tokenizer.mask_token_id

    position_ids = attention_mask.long().cumsum(-1)
    position_ids -= 1  # BertForMaskedLM

    position_ids.masked_fill_(attention_mask == 0, 1)

    outputs = model(input_ids=input_ids_repeated, attention_mask=attention_mask, position_ids=position_ids)
    lm_logits = outputs["logits"]

    for idx in range(lm_logits.shape[1]):
        if torch.any(mask_positions[:, idx]):
            lm_logits[:, idx, :] = logits_processor(input_ids=None, scores=lm_logits[:, idx, :])

    return lm_logits[mask_positions][0]


def gpt2_generate_self_debiasing_greedy(model, input_ids, debiasing_prefix_ids, max_length, decay_constant=50,
                                        epsilon=0.01, pad_token_id=0, eos_token_id=None):
    """GPT2Wrapper.generate_self_debiasing with greedy decoding (``do_sample=False``, one beam), through
    SelfDebiasingGPT2LMHeadModel.greedy_search and SelfDebiasingLogitsProcessor. Changes: the texts
    ``input_texts + [prefix + text for prefix for text]`` given as token ids (``input_ids``: one list
    per input; ``debiasing_prefix_ids``: one list per prefix, prepended to each input) instead of
    ``batch_encode_plus(..., padding=True)`` of the joined strings, the left padding built the same
    way (right-padded, mask flipped, ids rolled); greedy_search's loop written without the
    key/value cache (each step re-runs the whole sequences: the same logits up to float rounding),
    its position ids as GPT2LMHeadModel.prepare_inputs_for_generation computes them from the
    attention mask; ``max_length`` counts new tokens (generate_self_debiasing adds the input
    length); the only other processor/stopping criterion kept is EOS. Returns the new tokens of
    the regular rows."""
    logits_processor = SelfDebiasingLogitsProcessor(num_debiasing_prefixes=len(debiasing_prefix_ids),
                                                    decay_constant=decay_constant, epsilon=epsilon)
    inputs = [list(x) for x in input_ids]
    for prefix in debiasing_prefix_ids:
        for x in input_ids:
            inputs += [list(prefix) + list(x)]
    width = max(len(x) for x in inputs)
    ids = torch.tensor([x + [pad_token_id] * (width - len(x)) for x in inputs])
    attention_mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in inputs])
    attention_mask = torch.flip(attention_mask, dims=[1])
    shifts = attention_mask.shape[-1] - attention_mask.sum(dim=-1)
    for batch_idx in range(ids.shape[0]):
        ids[batch_idx] = ids[batch_idx].roll(shifts[batch_idx].item())
    input_length = ids.shape[1]
    unfinished_sequences = ids.new(ids.shape[0]).fill_(1)
    for _ in range(max_length):
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids.masked_fill_(attention_mask == 0, 1)
        outputs = model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids)
        next_token_logits = outputs.logits[:, -1, :]
        next_tokens_scores = logits_processor(ids, next_token_logits)
        next_tokens = torch.argmax(next_tokens_scores, dim=-1)
        if eos_token_id is not None:
            next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
        ids = torch.cat([ids, next_tokens[:, None]], dim=-1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        if eos_token_id is not None:
            unfinished_sequences = unfinished_sequences.mul((next_tokens != eos_token_id).long())
            if unfinished_sequences.max() == 0:
                break
    batch_size = ids.shape[0] // (1 + len(debiasing_prefix_ids))
    return ids[:batch_size, input_length:].tolist()


# ---------------------------------------------------------------- dataset/inlp.py
def _load_gender_data(lines, attribute_words, n_sentences=10000, seed=0):
    """load_inlp_data + _load_gender_data: the file read replaced by ``lines``, nltk.sent_tokenize
    by one sentence per line, n_sentences (10000 in bias-bench) a parameter, prints removed."""
    import random

    random.seed(seed)
    male_biased_token_set = set([words[0] for words in attribute_words])
    female_biased_token_set = set([words[1] for words in attribute_words])

    male_sentences = []
    female_sentences = []

    male_sentences_clipped = []
    female_sentences_clipped = []
    neutral_sentences_clipped = []

    count_male_sentences = 0
    count_female_sentences = 0
    count_neutral_sentences = 0

    lines = list(lines)
    random.shuffle(lines)

    for line in lines:
        sentences = [line]

        for sentence in sentences:
            male_flag = False
            female_flag = False

            idx = -1
            tokens = sentence.split(" ")

            tokens = [token.lower() for token in tokens]

            if len(tokens) < 5:
                continue

            for token in tokens:
                if token in male_biased_token_set:
                    male_flag = True
                    idx = tokens.index(token)

                if token in female_biased_token_set:
                    female_flag = True
                    idx = tokens.index(token)

                if male_flag and female_flag:
                    break

            if not male_flag and not female_flag and count_neutral_sentences < n_sentences:
                index = random.randint(4, len(tokens))
                neutral_sentences_clipped.append(" ".join(tokens[:index]))
                count_neutral_sentences += 1
                continue

            if male_flag and female_flag:
                continue

            if male_flag and count_male_sentences < n_sentences:
                if sentence not in male_sentences:
                    male_sentences.append(sentence)
                    index = random.randint(idx, len(tokens))
                    male_sentences_clipped.append(" ".join(tokens[: index + 1]))
                    count_male_sentences += 1

            if female_flag and count_female_sentences < n_sentences:
                if sentence not in female_sentences:
                    female_sentences.append(sentence)
                    index = random.randint(idx, len(tokens))
                    female_sentences_clipped.append(" ".join(tokens[: index + 1]))
                    count_female_sentences += 1

        if count_male_sentences == count_female_sentences == count_neutral_sentences == n_sentences:
            break

    return {"male": male_sentences_clipped, "female": female_sentences_clipped, "neutral": neutral_sentences_clipped}


def _load_race_data(lines, attribute_words, n_sentences=10000, seed=0):
    """load_inlp_data + _load_race_data: the file read replaced by ``lines`` and ``attribute_words``
    (the "race" list), nltk.sent_tokenize by one sentence per line, n_sentences a parameter, prints
    removed. bias-bench's _load_religion_data is the same code on the "religion" list."""
    import random

    random.seed(seed)
    race_biased_token_set = set([word for words in attribute_words for word in words])

    race_sentences = []
    race_sentences_clipped = []
    neutral_sentences_clipped = []

    count_race_sentences = 0
    count_neutral_sentences = 0

    lines = list(lines)
    random.shuffle(lines)

    for line in lines:
        sentences = [line]

        for sentence in sentences:
            race_flag = False

            idx = -1
            tokens = sentence.split(" ")

            tokens = [token.lower() for token in tokens]

            if len(tokens) < 5:
                continue

            for token in tokens:
                if token in race_biased_token_set:
                    race_flag = True
                    idx = tokens.index(token)

            if not race_flag and count_neutral_sentences < n_sentences:
                index = random.randint(4, len(tokens))
                neutral_sentences_clipped.append(" ".join(tokens[:index]))
                count_neutral_sentences += 1
                continue

            if race_flag and count_race_sentences < n_sentences:
                if sentence not in race_sentences:
                    race_sentences.append(sentence)
                    index = random.randint(idx, len(tokens))
                    race_sentences_clipped.append(" ".join(tokens[: index + 1]))
                    count_race_sentences += 1

        if count_race_sentences == count_neutral_sentences == n_sentences:
            break

    return {"bias": race_sentences_clipped, "neutral": neutral_sentences_clipped}


def _race_augment_func(text, examples, attribute_words):
    words = text.split(" ")

    for i, (r1_word, r2_word, r3_word) in enumerate(attribute_words):
        if r1_word in words:
            r1_example = text
            r2_example = _replace_word_in_text(r1_word, r2_word, words)
            r3_example = _replace_word_in_text(r1_word, r3_word, words)
            examples.append({"r1_example": r1_example, "r2_example": r2_example, "r3_example": r3_example})

        if r2_word in words:
            r1_example = _replace_word_in_text(r2_word, r1_word, words)
            r2_example = text
            r3_example = _replace_word_in_text(r2_word, r3_word, words)
            examples.append({"r1_example": r1_example, "r2_example": r2_example, "r3_example": r3_example})

        if r3_word in words:
            r1_example = _replace_word_in_text(r3_word, r1_word, words)
            r2_example = _replace_word_in_text(r3_word, r2_word, words)
            r3_example = text
            examples.append({"r1_example": r1_example, "r2_example": r2_example, "r3_example": r3_example})

    return examples


def compute_race_subspace(data, model, tokenizer, batch_size=32):
    """compute_race_subspace (device fixed to CPU, tqdm removed; its three identical encoding blocks
    for r1, r2, r3 written as one loop over the three keys, same operations)."""
    all_embeddings_r1 = []
    all_embeddings_r2 = []
    all_embeddings_r3 = []

    n_batches = len(data) // batch_size
    for i in range(n_batches):
        offset = batch_size * i

        embeddings = []
        for key in ("r1_example", "r2_example", "r3_example"):
            inputs = tokenizer([example[key] for example in data[offset : offset + batch_size]],
                               return_tensors="pt", truncation=True, padding="max_length", max_length=128)
            with torch.no_grad():
                embedding = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])[
                    "last_hidden_state"]
                embedding *= inputs["attention_mask"].unsqueeze(-1)
                embedding = embedding.sum(dim=1)
                embedding /= inputs["attention_mask"].sum(dim=1, keepdims=True)
            embeddings.append(embedding)
        embedding_r1, embedding_r2, embedding_r3 = embeddings

        embedding_r1 /= torch.norm(embedding_r1, dim=-1, keepdim=True)
        embedding_r2 /= torch.norm(embedding_r2, dim=-1, keepdim=True)
        embedding_r3 /= torch.norm(embedding_r3, dim=-1, keepdim=True)

        all_embeddings_r1.append(embedding_r1.cpu().numpy())
        all_embeddings_r2.append(embedding_r2.cpu().numpy())
        all_embeddings_r3.append(embedding_r3.cpu().numpy())

    all_embeddings_r1 = np.concatenate(all_embeddings_r1, axis=0)
    all_embeddings_r2 = np.concatenate(all_embeddings_r2, axis=0)
    all_embeddings_r3 = np.concatenate(all_embeddings_r3, axis=0)

    means = (all_embeddings_r1 + all_embeddings_r2 + all_embeddings_r3) / 3.0
    all_embeddings_r1 -= means
    all_embeddings_r2 -= means
    all_embeddings_r3 -= means

    all_embeddings = np.concatenate([all_embeddings_r1, all_embeddings_r2, all_embeddings_r3], axis=0)

    pca = PCA(n_components=1)
    pca.fit(all_embeddings)

    bias_direction = torch.tensor(pca.components_[0], dtype=torch.float32)

    return bias_direction


def ternary_counterfactual_augmentation_text(sentences, bias_attribute_words, seed=0):
    """ternary_counterfactual_augmentation with ``sentence = tokenizer.decode(input_ids)`` replaced
    by the decoded sentences themselves, returning the texts it would re-tokenise; the global
    ``random`` (seeded by bias-bench's ``set_seed``) seeded here with ``seed``."""
    import random

    random.seed(seed)
    outputs = []
    for sentence in sentences:
        words = sentence.split()  # Tokenize based on whitespace.
        augmented_sentence = words[:]

        # Sample the augmentation pairs.
        r1_augmentation_pair = random.choice([1, 2])
        r2_augmentation_pair = random.choice([0, 2])
        r3_augmentation_pair = random.choice([0, 1])

        augmented = False
        for position, word in enumerate(words):
            for augmentation_words in bias_attribute_words:
                r1_word, r2_word, r3_word = augmentation_words

                if r1_word == word:
                    augmented = True
                    augmented_sentence[position] = augmentation_words[r1_augmentation_pair]

                if r2_word == word:
                    augmented = True
                    augmented_sentence[position] = augmentation_words[r2_augmentation_pair]

                if r3_word == word:
                    augmented = True
                    augmented_sentence[position] = augmentation_words[r3_augmentation_pair]

        if augmented:
            augmented_sentence = " ".join(augmented_sentence)
            outputs.append(augmented_sentence)
            outputs.append(sentence)
    return outputs
