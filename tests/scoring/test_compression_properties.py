"""Properties of Q_com: robustness against keyword stuffing (paper Appendix "Robustness of Compression
Quality Score Against Gaming Behaviors") and range/finiteness on arbitrary input."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ziprl.config import ScoringConfig
from ziprl.scoring import LEVELS, compression_quality, extract_keywords
from ziprl.scoring.compression import s_key

# Observations in the style of retrieved Wikipedia passages, a question each, and a good compression
# of each: several complete sentences that keep every query keyword the observation has.
CASES = [
    (
        "In which city was the physicist Marie Curie born, and which prizes did she win?",
        "Marie Curie. Marie Salomea Skłodowska-Curie (1867–1934) was a Polish and naturalised-French "
        "physicist and chemist who conducted pioneering research on radioactivity. She was the first "
        "woman to win a Nobel Prize, the first person to win a Nobel Prize twice, and the only person to "
        "win a Nobel Prize in two scientific fields. She was born in Warsaw, in what was then the Kingdom "
        "of Poland, part of the Russian Empire. She studied at Warsaw's clandestine Flying University and "
        "began her practical scientific training in Warsaw. In 1891, aged 24, she followed her elder "
        "sister Bronisława to study in Paris, where she earned her higher degrees and conducted her "
        "subsequent scientific work.\n\nPierre Curie. Pierre Curie (1859–1906) was a French physicist, a "
        "pioneer in crystallography, magnetism, piezoelectricity and radioactivity. In 1903 he received "
        "the Nobel Prize in Physics with his wife, Marie Curie, and Henri Becquerel, in recognition of "
        "the extraordinary services they rendered by their joint researches on the radiation phenomena "
        "discovered by Becquerel. He died in a street accident in Paris in 1906.\n\nWarsaw. Warsaw is the "
        "capital and largest city of Poland. The metropolis stands on the River Vistula in east-central "
        "Poland. Its population is officially estimated at 1.8 million residents within a greater "
        "metropolitan area of 3.1 million residents.",
        "Marie Curie, the Polish physicist and chemist, was born in the city of Warsaw, then part of the Russian "
        "Empire. She won the Nobel Prize twice: in Physics in 1903, shared with Pierre Curie and Henri "
        "Becquerel, and later in Chemistry. She remains the only person to win a Nobel Prize in two "
        "scientific fields.",
    ),
    (
        "Which capital cities does the Danube river flow through?",
        "Danube. The Danube is the second-longest river in Europe, after the Volga in Russia. It flows "
        "through much of Central and Southeastern Europe, from the Black Forest into the Black Sea. A "
        "large and historically important river, it was once a frontier of the Roman Empire. In the 21st "
        "century, it connects ten European countries, running through their territories or marking a "
        "border. Originating in Germany, the Danube flows southeast for 2,850 km, passing through or "
        "bordering Austria, Slovakia, Hungary, Croatia, Serbia, Romania, Bulgaria, Moldova, and Ukraine. "
        "Among the many cities on the river are four national capitals: Vienna, Bratislava, Budapest, and "
        "Belgrade.\n\nBudapest. Budapest is the capital and most populous city of Hungary. The city has "
        "an estimated population of 1.7 million and covers an area of about 525 square kilometres. "
        "Budapest became a single city occupying both banks of the Danube with the unification of Buda "
        "and Óbuda on the west bank, with Pest on the east bank in 1873.",
        "The Danube, Europe's second-longest river, flows 2,850 km from Germany to the Black Sea. It "
        "passes through four capital cities: Vienna, Bratislava, Budapest and Belgrade. Budapest, the "
        "capital of Hungary, lies on both banks of the river.",
    ),
    (
        "Who was the command module pilot of the Apollo 11 mission?",
        "Apollo 11. Apollo 11 was the American spaceflight that first landed humans on the Moon. "
        "Commander Neil Armstrong and lunar module pilot Buzz Aldrin landed the Apollo Lunar Module Eagle "
        "on July 20, 1969, and Armstrong became the first person to step onto the Moon's surface six hours "
        "and 39 minutes later. Aldrin joined him 19 minutes later, and they spent about two and a quarter "
        "hours together exploring the site they had named Tranquility Base. Michael Collins flew the "
        "command module Columbia alone in lunar orbit while they were on the Moon's surface. Armstrong "
        "and Aldrin spent 21.5 hours on the lunar surface before lifting off to rejoin Columbia.\n\n"
        "Michael Collins. Michael Collins (1930–2021) was an American astronaut who flew the Apollo 11 "
        "command module Columbia around the Moon in 1969 while his crewmates made the first crewed "
        "landing on the surface. He was also a test pilot and a major general in the Air Force Reserve. "
        "After retiring from NASA in 1970, he became the first director of the National Air and Space Museum.",
        "Michael Collins was the command module pilot of Apollo 11. He flew the command module Columbia "
        "alone in lunar orbit in July 1969. Meanwhile mission commander Neil Armstrong and lunar module "
        "pilot Buzz Aldrin landed on the Moon.",
    ),
]
REPEATS = (1, 3, 10, 50)


def _stuffings(question: str, source: str) -> list[str]:
    """Ways to pad a compression with query keywords: repeated as bare words or as 'sentences',
    both the keywords the source has and those it lacks."""
    kq = sorted(extract_keywords(question))
    present = [k for k in kq if k in extract_keywords(source)]
    out = []
    for words in (present, kq):
        for k in REPEATS:
            out.append(" ".join(words * k))
            out.append(" ".join([" ".join(words).capitalize() + "."] * k))
    return out


def _scale_for(level: int, char_high: float) -> float:
    """The level_scale that puts the level's upper character bound at ``char_high``."""
    return char_high / LEVELS[level].char_high


def _is_good(question: str, source: str, compressed: str, level: int, scale: float) -> None:
    score = compression_quality(question, source, compressed, level, scale)
    assert (score.ratio, score.level, score.sem) == (1.0, pytest.approx(1.0), 1.0)
    kq, kx, ky = (extract_keywords(t) for t in (question, source, compressed))
    assert s_key(kq, kx, ky) == pytest.approx(1.0)  # keeps every query keyword the source has


def test_cases_are_realistic():
    for question, source, compressed in CASES:
        assert 1000 <= len(source) <= 3000
        assert 150 <= len(compressed) <= len(source) / 2
        assert extract_keywords(question) & extract_keywords(source)


@pytest.mark.parametrize("case", CASES, ids=["curie", "danube", "apollo"])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_stuffing_a_budget_filling_compression_lowers_total(case, level):
    # A good compression that uses its level's budget: any stuffing overflows the range, and the
    # Q_ratio penalty outweighs the small gain in S_gen's length term.
    question, source, compressed = case
    scale = _scale_for(level, len(compressed))
    _is_good(question, source, compressed, level, scale)
    base = compression_quality(question, source, compressed, level, scale)
    for pad in _stuffings(question, source):
        stuffed = compression_quality(question, source, compressed + " " + pad, level, scale)
        assert stuffed.total < base.total, pad


@pytest.mark.parametrize("case", CASES, ids=["curie", "danube", "apollo"])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_stuffing_cannot_raise_total_once_length_term_is_saturated(case, level):
    # With |y| >= |x| / 2, S_gen's length term is already 1: stuffing has nothing left to gain, even
    # when the padded text still fits the level's range.
    question, source, compressed = case
    source = source[: 2 * len(compressed)]
    scale = _scale_for(level, 2 * len(compressed))
    _is_good(question, source, compressed, level, scale)
    base = compression_quality(question, source, compressed, level, scale)
    for pad in _stuffings(question, source):
        stuffed = compression_quality(question, source, compressed + " " + pad, level, scale)
        assert stuffed.total <= base.total, pad


@pytest.mark.parametrize("case", CASES, ids=["curie", "danube", "apollo"])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_repeating_query_keywords_cannot_lift_total_in_range(case, level):
    # The paper's anti-gaming property, inside the range and below |x| / 2 where only S_gen's length
    # term could move: |y| counts distinct tokens, so repeating query keywords y already holds adds
    # nothing to S_key, K_x coverage or the length term, and Q_ratio, Q_level, Q_sem cannot rise.
    question, source, compressed = case
    scale = _scale_for(level, 1.4 * len(compressed))
    _is_good(question, source, compressed, level, scale)
    base = compression_quality(question, source, compressed, level, scale)
    held = sorted(extract_keywords(question) & extract_keywords(compressed))
    assert held
    for k in REPEATS:
        for pad in (" ".join(held * k), " ".join([" ".join(held).capitalize() + "."] * k)):
            stuffed = compression_quality(question, source, compressed + " " + pad, level, scale)
            assert stuffed.info == pytest.approx(base.info), pad
            assert stuffed.total <= base.total + 1e-12, pad


keyword_sets = st.frozensets(st.sampled_from([f"word{i}" for i in range(12)]), max_size=12)


@given(keyword_sets, keyword_sets, keyword_sets, keyword_sets)
def test_s_key_never_exceeds_one_and_stuffing_cannot_raise_it(kq, kx, ky, extra):
    assert 0.0 <= s_key(kq, kx, ky) <= 1.0
    # adding keywords the source lacks never helps; adding query keywords helps only up to 1
    assert s_key(kq, kx, ky | (extra - kx)) == s_key(kq, kx, ky)
    assert s_key(kq, kx, ky | kq | extra) <= 1.0


text_strategy = st.one_of(
    st.text(max_size=400),
    st.lists(st.sampled_from(["Paris", "is", "the", "capital", "of", "France", ".", "!", "?", "Über", "naïve",
                              "1889", "—", "\n", "tower", "Eiffel's", "é", "\u00a0", "_x_"]),
             max_size=300).map(" ".join),
)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(question=text_strategy, source=text_strategy, compressed=text_strategy,
       level=st.integers(1, 5), scale=st.floats(1e-3, 10.0),
       weights=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4).filter(lambda w: sum(w) > 1e-3))
def test_every_part_and_total_finite_in_unit_interval(question, source, compressed, level, scale, weights):
    w = [v / sum(weights) for v in weights]
    cfg = ScoringConfig(w_ratio=w[0], w_level=w[1], w_info=w[2], w_sem=w[3])
    for config in (None, cfg):
        s = compression_quality(question, source, compressed, level, scale, config)
        for part in (s.ratio, s.level, s.info, s.sem, s.total):
            assert math.isfinite(part)
            assert 0.0 <= part <= 1.0 + 1e-12
