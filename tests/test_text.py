"""Text vectoriser: exact term frequencies, empty-row reporting, vocabulary persistence."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.exceptions import NotFittedError
import scipy.sparse as sp

from streamtree.text import DEFAULT_LENGTH_POWER, TextVectorizer

SOTU = Path(__file__).resolve().parents[1] / "examples" / "data" / "sotu_paragraphs.parquet"


def small(**kw):
    """Unit tf rows (no tf-idf, no document weights): the tokenising tests read them."""
    return TextVectorizer(min_df=1, max_df=1.0, stop_words="english", norm="l2",
                          **{"weighting": "tf", "length_power": 0.0, **kw})


def test_default_rows_are_counts_the_default_model_fits():
    """One default: TextVectorizer()'s rows are the form DTSSBP()'s family reads."""
    from streamtree import DTSSBP

    docs = ["war navy army war", "tax tariff duties", "navy ships war", "tariff tax revenue tax"] * 5
    v = TextVectorizer(min_df=1, max_df=1.0).fit(docs)
    X = v.transform(docs)
    assert X[0, list(v.vocabulary_).index("war")] == 2.0  # "war" twice in the first document
    model = DTSSBP(n_sweeps=2, random_state=0).partial_fit(X)
    assert model.likelihood_.name == "multinomial" and model.trees_[-1].assignments.shape == (20,)


def test_exact_l2_normalised_term_frequencies():
    docs = ["Apple apple banana", "banana cherry cherry cherry", "apple 1790 $5 the"]
    v = small().fit(docs)
    assert v.vocabulary_.tolist() == ["apple", "banana", "cherry"]  # digits and stop words dropped
    X = v.transform(docs)
    empty = v.empty_rows(X)
    assert isinstance(X, sp.csr_matrix) and X.dtype == np.float64 and X.has_sorted_indices
    expected = np.array([[2, 1, 0], [0, 1, 3], [1, 0, 0]], dtype=float)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(X.toarray(), expected, rtol=0, atol=1e-15)
    assert not empty.any()
    np.testing.assert_array_equal(v.document_frequency_, [2, 2, 1])


def test_vmf_rows_default_to_exact_tfidf():
    """``norm="l2"`` rows are tf-idf unless ``weighting="tf"``: counts times
    log((1 + n) / (1 + df)) + 1 of the fitting corpus, then unit length (the default), or then
    the document's weight, its token count over the median's to ``length_power`` (1/2 by
    default, the vMF's document weights); raw counts ignore both."""
    docs = ["Apple apple banana", "banana cherry cherry cherry", "apple 1790 $5 the", "banana"]
    assert TextVectorizer().length_power == DEFAULT_LENGTH_POWER == 0.5
    v = TextVectorizer(min_df=1, max_df=1.0, norm="l2", length_power=1).fit(docs)
    assert v.weighting == "tfidf" and v.vocabulary_.tolist() == ["apple", "banana", "cherry"]
    assert v.reference_length_ == 2.0  # lengths 3, 4, 1, 1
    idf = np.log(5.0 / (1.0 + np.array([2, 3, 1]))) + 1.0
    counts = np.array([[2, 1, 0], [0, 1, 3], [1, 0, 0], [0, 1, 0]], dtype=float)
    expected = counts * idf
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    expected *= (counts.sum(axis=1, keepdims=True) / 2.0)
    np.testing.assert_allclose(v.transform(docs).toarray(), expected, rtol=0, atol=1e-15)
    unit = TextVectorizer(min_df=1, max_df=1.0, norm="l2", length_power=0).fit(docs).transform(docs).toarray()
    np.testing.assert_allclose(unit, expected / (counts.sum(axis=1, keepdims=True) / 2.0), rtol=0, atol=1e-15)
    root = TextVectorizer(min_df=1, max_df=1.0, norm="l2").fit(docs).transform(docs)  # the default power
    np.testing.assert_allclose(root.toarray(), unit * np.sqrt(counts.sum(axis=1, keepdims=True) / 2.0),
                               rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(np.sqrt(np.asarray(root.multiply(root).sum(axis=1)).ravel()),
                               np.sqrt(counts.sum(axis=1) / 2.0), rtol=1e-15)
    counts = TextVectorizer(min_df=1, max_df=1.0).fit(docs).transform(docs).toarray()
    np.testing.assert_array_equal(counts, [[2, 1, 0], [0, 1, 3], [1, 0, 0], [0, 1, 0]])


def test_unicode_tokens():
    v = small().fit(["Über naïve café", "ÜBER Straße"])
    assert set(v.vocabulary_) == {"über", "naïve", "café", "straße"}
    X = v.transform(["über über café"])
    col = {t: i for i, t in enumerate(v.vocabulary_)}
    assert X[0, col["über"]] == pytest.approx(2 / np.sqrt(5)) and X[0, col["café"]] == pytest.approx(1 / np.sqrt(5))


def test_empty_after_filtering_is_reported_not_dropped():
    v = small().fit(["alpha beta", "beta gamma"])
    texts = ["alpha", "the and of", "zeta eta", "", "gamma alpha", "42"]
    X = v.transform(texts)
    empty = v.empty_rows(X)
    assert X.shape == (6, 3)  # every input keeps its row
    assert empty.tolist() == [False, True, True, True, False, True]
    assert np.flatnonzero(empty).tolist() == [1, 2, 3, 5]
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms[~empty], 1.0, rtol=0, atol=1e-15)
    assert (norms[empty] == 0).all()


def test_document_frequency_pruning():
    docs = ["common rare", "common other", "common other", "common thing"]
    v = TextVectorizer(min_df=2, max_df=0.9, stop_words=None).fit(docs)
    assert v.vocabulary_.tolist() == ["other"]  # "common" is in 100% > 90%, others in < 2 docs
    assert TextVectorizer(min_df=1, max_df=1.0, max_features=2, stop_words=None).fit(docs).vocabulary_.tolist() == ["common", "other"]
    with pytest.raises(ValueError, match="vocabulary fitting failed"):
        TextVectorizer(min_df=10).fit(docs)
    # one document cannot hold a term in two documents and in at most half of them: say so, not
    # the library's "max_df corresponds to < documents than min_df"
    with pytest.raises(ValueError, match="1 document is too few for min_df=2 and max_df=0.5 together") as err:
        TextVectorizer().fit(["one document left after the rejects"])
    assert "corresponds" not in str(err.value)


def test_hash_and_persistence_round_trip(tmp_path):
    docs = ["the quick brown fox", "lazy dogs jump", "quick quick dogs", "Brown owls"]
    v = small().fit(docs)
    terms = v.vocabulary_.tolist()
    assert v.vocabulary_hash() == hashlib.sha256("\n".join(terms).encode()).hexdigest()
    pq.write_table(v.to_arrow(), tmp_path / "vocabulary.parquet")
    w = TextVectorizer.from_arrow(pq.read_table(tmp_path / "vocabulary.parquet"))
    assert w.vocabulary_.tolist() == terms and w.vocabulary_hash() == v.vocabulary_hash()
    assert w.min_df == 1 and w.stop_words == "english" and w.n_fit_documents_ == 4
    new = ["quick owls and foxes", "nothing known here"]
    Xa, Xb = v.transform(new), w.transform(new)
    ea, eb = v.empty_rows(Xa), w.empty_rows(Xb)
    assert (Xa != Xb).nnz == 0 and ea.tolist() == eb.tolist() == [False, True]
    # Rows in shuffled order come back in column order; edited terms fail the hash check.
    t = v.to_arrow()
    perm = np.random.default_rng(0).permutation(t.num_rows)
    assert TextVectorizer.from_arrow(t.take(pa.array(perm))).vocabulary_.tolist() == terms
    edited = t.set_column(1, "term", pa.array(["x" + s for s in terms]))
    with pytest.raises(ValueError, match="hash"):
        TextVectorizer.from_arrow(edited)
    with pytest.raises(ValueError, match="metadata"):
        TextVectorizer.from_arrow(t.replace_schema_metadata({}))


def test_document_weights_persist_and_older_vocabularies_keep_unit_rows(tmp_path):
    """The length power and the reference length ride with the vocabulary, so a restored store
    weighs documents as its model was fitted; a vocabulary written before weights existed
    carries neither and keeps unit rows."""
    import json

    docs = ["tax war tax", "war peace", "tax peace war war tax", "peace"]
    v = TextVectorizer(min_df=1, max_df=1.0, stop_words=None, norm="l2", length_power=1).fit(docs)
    w = TextVectorizer.from_arrow(v.to_arrow())
    assert w.length_power == 1.0 and w.reference_length_ == v.reference_length_ == 2.5
    assert (w.transform(docs) != v.transform(docs)).nnz == 0
    t = v.to_arrow()
    meta = json.loads(t.schema.metadata[b"streamtree.vectorizer"])
    del meta["params"]["length_power"], meta["reference_length"]
    old = TextVectorizer.from_arrow(t.replace_schema_metadata({b"streamtree.vectorizer": json.dumps(meta).encode()}))
    X = old.transform(docs)
    assert old.length_power == 0.0
    np.testing.assert_allclose(np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel()), 1.0, rtol=1e-15)
    with pytest.raises(ValueError, match="length_power"):
        TextVectorizer(norm="l2", length_power=-1).fit(docs)


def test_validation():
    with pytest.raises(NotFittedError, match="not fitted"):
        TextVectorizer().transform(["a"])
    with pytest.raises(ValueError, match="zero documents"):
        TextVectorizer().fit([])
    with pytest.raises(TypeError, match="single string"):
        small().fit("just one string")


def test_sotu_vocabulary_and_rows():
    texts = pq.read_table(SOTU, columns=["text"]).column("text")
    v = TextVectorizer(min_df=5, max_df=0.5, norm="l2", length_power=0)  # unit rows
    X = v.fit_transform(texts)
    empty = v.empty_rows(X)
    Xt = v.transform(texts[:300])
    et = v.empty_rows(Xt)
    assert (Xt != X[:300]).nnz == 0 and (et == empty[:300]).all()
    assert X.shape == (25_488, v.vocabulary_.shape[0]) and 5_000 < X.shape[1] < 20_000
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms[~empty], 1.0, atol=1e-12)
    lengths = np.asarray(v._fixed.transform(texts.to_pylist()).sum(axis=1)).ravel()
    assert v.reference_length_ == np.median(lengths[lengths > 0])
    weighted = TextVectorizer(min_df=5, max_df=0.5, norm="l2", length_power=1).fit(texts).transform(texts)
    norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms[~empty], lengths[~empty] / v.reference_length_, rtol=1e-12)
    default = TextVectorizer(min_df=5, max_df=0.5, norm="l2").fit(texts).transform(texts[:300])
    norms = np.sqrt(np.asarray(default.multiply(default).sum(axis=1)).ravel())
    np.testing.assert_allclose(norms[~empty[:300]], np.sqrt(lengths[:300][~empty[:300]] / v.reference_length_),
                               rtol=1e-12)
    assert 0 < empty.sum() < 100  # a few one-word salutations have no vocabulary term
    assert {"war", "congress", "tax"} <= set(v.vocabulary_)


def test_transcript_stage_directions_are_stop_words():
    docs = ["We will win. (Applause.)", "Taxes fall [laughter] and taxes rise (inaudible)", "win taxes"]
    assert small().fit(docs).vocabulary_.tolist() == ["fall", "rise", "taxes", "win"]


def test_a_stored_vocabulary_keeps_counting_terms_that_became_stop_words(monkeypatch):
    """A store written before "applause" was a stop word has it in its vocabulary: restoring the
    vectoriser (resume, serve restart, assign) must still count it, or the resumed run and the
    assigned documents silently differ from the stored model's."""
    import streamtree.text as text

    monkeypatch.setattr(text, "STOP_WORDS", text.STOP_WORDS - text.TRANSCRIPT_STOP_WORDS)
    fitted = small().fit(["tax cut applause", "war peace applause", "tax war"])
    want = fitted.transform(["applause tax"]).toarray()
    table = fitted.to_arrow()
    monkeypatch.undo()
    restored = TextVectorizer.from_arrow(table)
    np.testing.assert_array_equal(restored.transform(["applause tax"]).toarray(), want)


def test_web_and_mail_addresses_are_not_terms():
    """Commit messages, changelogs and posts carry URLs and e-mail addresses; their pieces
    ("https", "github", "com", a user's name and host) must not become terms."""
    docs = ["Fix the parser, see https://github.com/pallets/flask/issues/12 for details",
            "Signed-off-by: Jane Roe <jane.roe@example-4.com>",
            "parser docs at WWW.Example.org/docs; mail bugs@lists.example.net",
            "git clone git+ssh://host.example/repo.git then fix the parser (http://x.io).",
            "an email@ alone is no address; Merge branch 'master' of github.com:mitsuhiko/flask",
            "docs moved to flask.pocoo.org/docs/, see Flask.app and e.g. the os.path module"]
    v = TextVectorizer(min_df=1, max_df=1.0, stop_words=None).fit(docs)
    terms = set(v.vocabulary_)
    assert not terms & {"https", "http", "github", "com", "pallets", "issues", "example", "org",
                        "www", "lists", "net", "ssh", "host", "repo", "io", "bugs", "mitsuhiko", "pocoo"}
    # the words around them stay, a display name too (it is text, not an address)
    assert terms == {"fix", "the", "parser", "see", "for", "details", "signed", "off", "by", "jane", "roe", "docs",
                     "at", "mail", "git", "clone", "then", "an", "email", "alone", "is", "no", "address", "merge",
                     "branch", "master", "of", "moved", "to", "flask", "app", "and", "os", "path", "module"}
    # the same texts without the rule keep the pieces (the rule is what removes them)
    kept = set(TextVectorizer(min_df=1, max_df=1.0, stop_words=None, strip_addresses=False).fit(docs).vocabulary_)
    assert {"https", "github", "com", "pallets", "example", "bugs"} <= kept
    counts = v.transform(["Parser: https://parser.example/parser PARSER"]).toarray().ravel()
    assert counts[v.vocabulary_.tolist().index("parser")] == 2  # lower-cased as before, the URL's copy gone


def test_names_with_an_upper_case_domain_are_not_addresses():
    """"ASP.NET", "VB.NET" and "System.IO" name a framework, a language and a namespace: their
    words stay; a host name stays an address whatever the case of its other labels."""
    docs = ["Port the ASP.NET views to VB.NET", "read it with System.IO streams", "see Flask.pocoo.org/docs"]
    terms = set(TextVectorizer(min_df=1, max_df=1.0, stop_words=None).fit(docs).vocabulary_)
    assert {"asp", "net", "vb", "system", "io", "port", "views", "streams"} <= terms
    assert not terms & {"pocoo", "org", "docs"}


def test_vocabularies_stored_before_addresses_were_removed_keep_them():
    """A store fitted when addresses were still tokenised has no ``strip_addresses`` in its
    metadata: restoring it must count as it was fitted (resume, serve, assign)."""
    import json

    v = TextVectorizer(min_df=1, max_df=1.0, stop_words=None, strip_addresses=False).fit(
        ["see https://github.com/x", "github parser"])
    table = v.to_arrow()
    meta = json.loads(table.schema.metadata[b"streamtree.vectorizer"])
    del meta["params"]["strip_addresses"]
    old = table.replace_schema_metadata({b"streamtree.vectorizer": json.dumps(meta).encode()})
    restored = TextVectorizer.from_arrow(old)
    assert restored.strip_addresses is False
    np.testing.assert_array_equal(restored.transform(["https://github.com/y"]).toarray(),
                                  v.transform(["https://github.com/y"]).toarray())
    assert TextVectorizer.from_arrow(small().fit(["tax cut", "war"]).to_arrow()).strip_addresses is True
    # and a vMF vocabulary stored before tf-idf weighting existed keeps plain term frequencies
    tf = small().fit(["tax cut", "tax war", "peace"])
    meta = json.loads(tf.to_arrow().schema.metadata[b"streamtree.vectorizer"])
    del meta["params"]["weighting"]
    older = tf.to_arrow().replace_schema_metadata({b"streamtree.vectorizer": json.dumps(meta).encode()})
    assert TextVectorizer.from_arrow(older).weighting == "tf"
    np.testing.assert_array_equal(TextVectorizer.from_arrow(older).transform(["tax war war"]).toarray(),
                                  tf.transform(["tax war war"]).toarray())


def test_chinese_and_japanese_text_becomes_pairs_of_characters():
    """Text written without spaces between words is one token a sentence under the token
    pattern: each run of its characters becomes the pairs of neighbouring characters, the
    token's other letters going through the pattern again; other text is tokenised as before."""
    v = TextVectorizer(min_df=1, max_df=1.0, stop_words=None)
    assert v.fit(["我喜欢猫。她喜欢狗！"]).vocabulary_.tolist() == sorted(["我喜", "喜欢", "欢猫", "她喜", "欢狗"])
    assert v.fit(["東京タワー"]).vocabulary_.tolist() == sorted(["東京", "京タ", "タワ", "ワー"])
    assert v.fit(["新iPhone手机 很好 猫"]).vocabulary_.tolist() == sorted(["iphone", "手机", "很好"])  # a lone 新, 猫: no pair
    X = v.fit(["很好很好"]).transform(["很好很好"])
    assert X.toarray().tolist() == [[1.0, 2.0]]  # columns 好很, 很好: 好很 once, 很好 twice
    english = ["Taxes fall and the war ends", "war and peace; taxes rise"]
    runs = TextVectorizer(min_df=1, max_df=1.0, stop_words=None, unspaced_terms="runs")
    assert v.fit(english).vocabulary_.tolist() == runs.fit(english).vocabulary_.tolist()
    np.testing.assert_array_equal(v.transform(english).toarray(), runs.transform(english).toarray())
    assert runs.fit(["我喜欢猫。她喜欢狗！"]).vocabulary_.tolist() == ["她喜欢狗", "我喜欢猫"]


def test_vocabularies_stored_before_character_pairs_keep_whole_runs():
    import json

    table = TextVectorizer(min_df=1, max_df=1.0, unspaced_terms="runs").fit(["我喜欢猫", "我喜欢猫 她喜欢狗"]).to_arrow()
    meta = json.loads(table.schema.metadata[b"streamtree.vectorizer"])
    del meta["params"]["unspaced_terms"]
    old = TextVectorizer.from_arrow(table.replace_schema_metadata({b"streamtree.vectorizer": json.dumps(meta).encode()}))
    assert old.unspaced_terms == "runs"
    assert old.transform(["我喜欢猫"]).toarray().tolist() == [[0.0, 1.0]]
    assert TextVectorizer.from_arrow(TextVectorizer(min_df=1).fit(["猫狗", "狗猫"]).to_arrow()).unspaced_terms == "bigrams"


def test_a_chinese_corpus_is_fitted_rather_than_rejected():
    """Three topics of two-character words written without spaces: read as character pairs
    every document keeps terms and the default model separates the topics; read as whole runs
    (the former tokenising) nearly every document is empty after vocabulary filtering."""
    from sklearn.metrics import adjusted_rand_score

    from streamtree.model import DTSSBP

    words = [["天气", "下雨", "台风", "气温", "预报"], ["比赛", "球队", "进球", "教练", "联赛"],
             ["股票", "市场", "投资", "价格", "银行"]]
    rng = np.random.default_rng(0)
    topics = rng.integers(3, size=300)
    texts = ["".join(rng.choice(words[k], size=int(rng.integers(4, 9)))) + "。" for k in topics]
    runs = TextVectorizer(unspaced_terms="runs")
    assert TextVectorizer.empty_rows(runs.fit_transform(texts)).mean() > 0.9
    vec = TextVectorizer()
    X = vec.fit_transform(texts)
    assert not TextVectorizer.empty_rows(X).any()
    tree = DTSSBP(max_depth=2, random_state=0).partial_fit(X).trees_[-1]
    assert adjusted_rand_score(topics, tree.assignments) > 0.9
