"""Reward fidelity: agreement of our correctness reward with expected labels, and its false positives.

    python bench/reward_fidelity.py            # all cases, through RewardScorer's worker pool
    python bench/reward_fidelity.py --quick    # the first case of each category (CI smoke)

Each case is (category, gold as a dataset stores it, response, expected 0/1). The categories follow the ones
upstream Math-Verify's own test suite covers (number formats, fractions, sets and intervals, LaTeX notations,
percent, units, equations, matrices, competition answers, ...) plus six fault kinds of a last-box-only grader
(several boxes in the response, several boxes in the gold, units in the box, number formats, ``\\mathrm{e}``, tiny
magnitudes); the cases are our own, written for a boxed-answer reward (a response states its answer in
``\\boxed{}`` or a ``####`` line).

Two arms, scored on the same cases in one invocation:

* ``mugrpo``: the product path: gold through :func:`mugrpo.data.answers.extract_gold`, each response through
  :class:`mugrpo.rewards.RewardScorer` (answer extraction, ``math_correctness`` in the killable worker pool);
* ``math-verify alone``: a last-box-only grader (gold = the last box, answer = the last box, then
  ``verify(parse(gold), parse(answer))``), for reference.

Printed: agreement, false positives (scored 1, expected 0), false negatives, per category, and every disagreement.
Target: agreement >= 98% and zero false positives for the ``mugrpo`` arm.
"""

from __future__ import annotations

import argparse
import logging
from collections import defaultdict

from math_verify import parse, verify

from mugrpo.data.answers import extract_boxed, extract_gold
from mugrpo.rewards import RewardConfig, RewardInput, RewardScorer

B = r"The answer is $\boxed{%s}$."

CASES: list[tuple[str, object, str, int]] = [
    # --- kind 1: several boxes in the response ---
    ("k1 several response boxes", "1,2,3", r"So $x = \boxed{1}$ and $x = \boxed{2}$ and $x = \boxed{3}$.", 1),
    ("k1 several response boxes", "1,2,3", r"\boxed{3}, \boxed{2}, \boxed{1}", 1),
    ("k1 several response boxes", "1,2,3", r"\boxed{1} and \boxed{2}", 0),
    ("k1 several response boxes", "1,2,3", r"\boxed{1}, \boxed{2}, \boxed{3}, \boxed{4}, \boxed{5}", 0),
    ("k1 several response boxes", "7", r"Try $\boxed{5}$. No: we need more, so $\boxed{7}$", 1),
    ("k1 several response boxes", "5", r"Try $\boxed{5}$. No: we need more, so $\boxed{7}$", 0),
    ("k1 several response boxes", r"-1, 4", r"The roots are $\boxed{4}$ or $\boxed{-1}$.", 1),
    # --- kind 2: several boxes in the gold ---
    ("k2 multi-box gold", r"Hence \boxed{1} and \boxed{-2}.", r"\boxed{1, -2}", 1),
    ("k2 multi-box gold", r"Hence \boxed{1} and \boxed{-2}.", r"\boxed{-2} and \boxed{1}", 1),
    ("k2 multi-box gold", r"Hence \boxed{1} and \boxed{-2}.", r"\boxed{-2}", 0),
    ("k2 multi-box gold", r"Hence \boxed{1} and \boxed{-2}.", r"\boxed{1}", 0),
    (
        "k2 multi-box gold",
        r"$d = \boxed{15\frac{39}{40}}$, or $\boxed{\frac{639}{40}}$ inches",
        B % r"\frac{639}{40}",
        1,
    ),
    ("k2 multi-box gold", r"$d = \boxed{15\frac{39}{40}}$, or $\boxed{\frac{639}{40}}$ inches", B % "15.975", 1),
    ("k2 multi-box gold", r"$d = \boxed{15\frac{39}{40}}$, or $\boxed{\frac{639}{40}}$ inches", B % "16", 0),
    # --- kind 3: units inside the box ---
    ("k3 units in the box", "1000.99", B % "1,000.99€", 1),
    ("k3 units in the box", "1000.99", B % r"1000.99 \text{ euros}", 1),
    ("k3 units in the box", "1000.99", B % r"\$1,000.99", 1),
    ("k3 units in the box", "1000.99", B % "1,000.99 dollars", 1),
    ("k3 units in the box", "1000.99", B % "1,001.99€", 0),
    ("k3 units in the box", "12", B % r"12\text{ m}^2", 1),
    ("k3 units in the box", "12", B % r"13\,\text{m}^2", 0),
    # --- kind 4: number formats ---
    ("k4 number formats", "1000", B % "1 000", 1),
    ("k4 number formats", "1000", B % r"1\,000", 1),
    ("k4 number formats", "1000", B % r"1{,}000", 1),
    ("k4 number formats", "0", B % "1 000", 0),
    ("k4 number formats", "2.74", B % "2,74", 1),
    ("k4 number formats", "2.74", B % r"2{,}74", 1),
    ("k4 number formats", "274", B % "2,74", 0),
    ("k4 number formats", "0.111", B % "0,111", 1),
    ("k4 number formats", "111", B % "0,111", 0),
    ("k4 number formats", "2740", B % "2,740", 1),
    # --- kind 5: \mathrm{e} ---
    ("k5 upright e", r"1 - \frac{1}{\mathrm{e}}", B % r"1 - \frac{1}{e}", 1),
    ("k5 upright e", r"1 - \frac{1}{\mathrm{e}}", B % r"1-\frac{1}{\mathrm{e}}", 1),
    ("k5 upright e", r"1 - \frac{1}{\mathrm{e}}", B % r"1 - \frac{1}{\mathrm{e}^{2}}", 0),
    ("k5 upright e", r"\mathrm{e}^{2}", B % r"e^2", 1),
    ("k5 upright e", "2", B % r"2\mathrm{i}", 0),
    # --- kind 6: tiny magnitudes ---
    ("k6 tiny magnitudes", r"\frac{1}{2004!}", B % r"\frac{1}{2004!}", 1),
    ("k6 tiny magnitudes", r"\frac{1}{2004!}", B % r"\frac{1}{2006!}", 0),
    ("k6 tiny magnitudes", r"10^{-20}", B % r"10^{-21}", 0),
    ("k6 tiny magnitudes", r"10^{-20}", B % r"\frac{1}{10^{20}}", 1),
    ("k6 tiny magnitudes", "0.0000001", B % "0.0000002", 0),
    ("k6 tiny magnitudes", "0.0000001", B % r"1 \times 10^{-7}", 1),
    ("k6 tiny magnitudes", r"2^{-40}", B % r"2^{-41}", 0),
    # --- competition integers (AIME / AMC gold: ints, or floats like 27.0) ---
    ("competition integers", "204", B % "204", 1),
    ("competition integers", "204", B % "240", 0),
    ("competition integers", 27.0, B % "27", 1),
    ("competition integers", 27, B % "27.0", 1),
    ("competition integers", "033", B % "33", 1),
    ("competition integers", "-5", B % "-5", 1),
    ("competition integers", "-5", B % "5", 0),
    ("competition integers", "#### 1,250", "The total cost is $1,250.\n#### 1250", 1),
    ("competition integers", "#### 1,250", "#### 1,205", 0),
    ("competition integers", "#### 18", B % "18.00", 1),
    # --- number formats (thousands, decimals, negatives) ---
    ("numbers", "7425000", B % "7,425,000", 1),
    ("numbers", "7425000", B % "7 425 000", 1),
    ("numbers", "7425000", B % "7,425,001", 0),
    ("numbers", "1000", B % "1000.0", 1),
    ("numbers", "1000.0", B % "1,000.0", 1),
    ("numbers", "0.4", B % ".4", 1),
    ("numbers", "0.4", B % "0.04", 0),
    ("numbers", "-0.5", B % r"-\frac{1}{2}", 1),
    ("numbers", "-0.5", B % "0.5", 0),
    ("numbers", "3.14159", B % "3.14159", 1),
    ("numbers", "3.14159", B % "3.1416", 0),
    # --- fractions ---
    ("fractions", "10/9", B % r"\frac{10}{9}", 1),
    ("fractions", "-10/9", B % r"-\frac{10}{9}", 1),
    ("fractions", "10/9", B % r"\frac{9}{10}", 0),
    ("fractions", r"\frac{1}{3}", B % r"\frac13", 1),
    ("fractions", r"\frac{1}{3}", B % r"\dfrac{1}{3}", 1),
    ("fractions", r"\frac{1}{3}", B % r"\tfrac{1}{3}", 1),
    ("fractions", r"\frac{1}{3}", B % r"\cfrac{1}{3}", 1),
    ("fractions", r"\frac{1}{3}", B % "1/3", 1),
    ("fractions", r"\frac{1}{3}", B % "0.333333", 1),
    ("fractions", r"\frac{1}{3}", B % "0.33", 0),
    ("fractions", "1", B % r"\frac3{3}", 1),
    ("fractions", r"\frac{14}{3}", B % r"4\frac{2}{3}", 1),
    ("fractions", r"\frac{14}{3}", B % r"\frac{13}{3}", 0),
    # --- LaTeX notations and styling ---
    ("latex notation", "9", r"Answer: \[ \boxed{9} \]", 1),
    ("latex notation", "9", r"Answer: $$\boxed{9}$$", 1),
    ("latex notation", "9", r"Answer: \( \boxed{9} \)", 1),
    ("latex notation", "10", B % "(9+1)", 1),
    ("latex notation", r"\sqrt{3}", B % r"\sqrt3", 1),
    ("latex notation", r"\sqrt{3}", B % r"\sqrt{3}", 1),
    ("latex notation", r"\sqrt{3}", B % r"\sqrt{2}", 0),
    ("latex notation", r"\frac{1}{3}", B % r"\left( \frac{1}{3} \right)", 1),
    ("latex notation", r"\frac{1}{3}", B % r"\frac{1}{3} \text{meters}", 1),
    ("latex notation", r"\frac{1}{3}", B % r"\frac{1}{3} \textbf{meters}", 1),
    ("latex notation", r"\frac{1}{3}", B % r"k = \frac{1}{3}", 1),
    ("latex notation", r"\frac{1}{3}", B % r"k = \frac{1}{4}", 0),
    ("latex notation", "5", r"\fbox{5}", 1),
    ("latex notation", "5", r"\boxed {5}", 1),
    # --- percent ---
    ("percent", r"28\%", B % r"28\%", 1),
    ("percent", r"28\%", B % "28", 1),
    ("percent", r"28\%", B % "0.28", 1),
    ("percent", r"28\%", B % "28 percent", 1),
    ("percent", r"28\%", B % r"28 \%", 1),
    ("percent", r"28\%", B % r"27\%", 0),
    ("percent", "0.28", B % "28", 0),
    ("percent", "28", B % "28/100", 0),
    ("percent", r"\frac{28}{100}", B % "28", 0),
    # --- units and currency ---
    ("units", "5", B % r"5\text{ cm}", 1),
    ("units", "5", B % r"5 \mathrm{cm}", 1),
    ("units", "5", B % r"5\ \text{cm}", 1),
    ("units", "5", B % r"6 \text{ cm}", 0),
    ("units", "16386.17", B % r"\$16386.17", 1),
    ("units", "16386.17", B % r"\$16,386.17", 1),
    ("units", "16386.17", B % r"\$16386.18", 0),
    ("units", "20", B % "20 dollars", 1),
    ("units", "20", B % "25 dollars", 0),
    ("units", "45", B % r"45 \text{ minutes}", 1),
    # --- degrees ---
    ("degrees", r"90^\circ", B % "90", 1),
    ("degrees", r"90^\circ", B % r"90^{\circ}", 1),
    ("degrees", r"90^\circ", B % "90°", 1),
    ("degrees", "30", B % r"30^\circ", 1),
    ("degrees", r"90^\circ", B % r"45^\circ", 0),
    # --- text answers and multiple choice ---
    ("text", r"\text{Evelyn}", B % r"\text{Evelyn}", 1),
    ("text", r"\text{Evelyn}", B % r"\text{Carla}", 0),
    ("text", r"\text{(C)}", B % r"\text{(C)}", 1),
    ("text", r"\text{(C)}", B % "C", 1),
    ("text", r"\text{(C)}", B % r"\text{(B)}", 0),
    ("text", r"\text{odd}", B % r"\text{odd}", 1),
    ("text", r"\text{odd}", B % r"\text{even}", 0),
    # --- intervals ---
    ("intervals", "[0,1)", B % "[0,1)", 1),
    ("intervals", "[100, 200]", B % "[100,200]", 1),
    ("intervals", "[100,200]", B % "[100, 201]", 0),
    ("tuples", "(1, 234)", B % "(1,234)", 1),
    ("sets", r"\{100, 200\}", B % r"\{200,100\}", 1),
    ("intervals", "[0,9)", B % "[0,1)", 0),
    ("intervals", "(0,9)", B % "[0,9)", 0),
    ("intervals", r"(-\infty, 2]", B % r"(-\infty,2]", 1),
    ("intervals", r"(-\infty, 2]", B % r"(-\infty,2)", 0),
    ("intervals", r"[-2, 7]", B % r"x \in [-2,7]", 1),
    ("intervals", r"(1,3) \cup (4,\infty)", B % r"(1, 3) \cup (4, \infty)", 1),
    ("intervals", r"(1,3) \cup (4,\infty)", B % r"(1, 3) \cup [4, \infty)", 0),
    ("intervals", r"\left(\frac{1}{5},\frac{1}{6}\right)", B % r"\left( \frac{1}{5}, \frac{1}{6} \right)", 1),
    # --- sets ---
    ("sets", r"\{1, 2, 3\}", B % r"\{3, 2, 1\}", 1),
    ("sets", r"\{1, 2, 3\}", B % "1, 2, 3", 1),
    ("sets", r"\{1, 2, 3\}", B % r"\{1, 2\}", 0),
    ("sets", r"\{1, 2\}", B % r"\{1, 2, 3\}", 0),
    ("sets", "1, 5", B % "1,5", 1),
    ("sets", "1, 5", B % "1.5", 0),
    ("sets", r"\pm 2", B % "2, -2", 1),
    ("sets", r"\pm 2", B % "-2", 0),
    ("sets", r"1 \pm \sqrt{2}", r"$\boxed{1+\sqrt{2}}$ and $\boxed{1-\sqrt{2}}$", 1),
    ("sets", r"1 \pm \sqrt{2}", r"$\boxed{1+\sqrt{2}}$", 0),
    # --- tuples and points ---
    ("tuples", r"(3, \frac{\pi}{2})", B % r"\left( 3, \frac{\pi}{2} \right)", 1),
    ("tuples", r"(3, \frac{\pi}{2})", B % r"\left( 3, \frac{\pi}{4} \right)", 0),
    ("tuples", r"\left(\frac{4}{5},\frac{1}{5}\right)", B % r"\left( \frac{4}{5}, \frac{1}{5} \right)", 1),
    ("tuples", r"\left(\frac{4}{5},\frac{1}{5}\right)", B % r"\left( \frac{1}{5}, \frac{4}{5} \right)", 0),
    ("tuples", "(1, 2, 3)", B % "(1,2,3)", 1),
    ("tuples", "(1, 2, 3)", B % "(3,2,1)", 0),
    ("tuples", r"(\tfrac{27}{8},\tfrac{15}{8})", B % "(0, 0)", 0),
    # --- equations, relations and inequalities ---
    ("equations", "x = 2", B % "2", 1),
    ("equations", "2", B % "x = 2", 1),
    ("equations", "2", B % "x = 3", 0),
    ("equations", "y = 2x + 1", B % "y=1+2x", 1),
    ("equations", "y = 2x + 1", B % "y = 2x + 3", 0),
    ("equations", r"x^2 + y^2 = 25", B % r"x^2+y^2=25", 1),
    ("equations", r"x^2 + y^2 = 25", B % r"x^2+y^2=24", 0),
    ("equations", r"x > 3", B % r"3 < x", 1),
    ("equations", r"x > 3", B % r"x \geq 3", 0),
    # --- expressions and constants ---
    ("expressions", r"x^2 + 2x + 1", B % "(x+1)^2", 1),
    ("expressions", r"x^2 + 2x + 1", B % "(x-1)^2", 0),
    ("expressions", r"2\sqrt{3}", B % r"\sqrt{12}", 1),
    ("expressions", r"2\sqrt{3}", B % r"\sqrt{13}", 0),
    ("expressions", r"\frac{5\sqrt{2}}{2}", B % r"\frac{5}{\sqrt{2}}", 1),
    ("expressions", r"3\pi", B % r"3 \pi", 1),
    ("expressions", r"3\pi", B % r"\pi^3", 0),
    ("expressions", r"\frac{\pi}{4}", B % r"45^\circ", 0),
    ("expressions", r"\log_2 8", B % "3", 1),
    ("expressions", r"\sin \frac{\pi}{6}", B % r"\frac{1}{2}", 1),
    # --- complex numbers ---
    ("complex", "3 + 4i", B % "3+4i", 1),
    ("complex", "3 + 4i", B % "4i+3", 1),
    ("complex", "3 + 4i", B % "3-4i", 0),
    ("complex", "i", B % r"\sqrt{-1}", 1),
    # --- matrices and vectors ---
    (
        "matrices",
        r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}",
        B % r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}",
        1,
    ),
    (
        "matrices",
        r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}",
        B % r"\begin{pmatrix} 0 & 3 \\ 0 & 1 \end{pmatrix}",
        0,
    ),
    ("matrices", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", B % r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", 1),
    ("matrices", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", B % r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}", 0),
    # --- very large numbers ---
    ("large numbers", "2^{100}", B % "1267650600228229401496703205376", 1),
    ("large numbers", "2^{100}", B % "1267650600228229401496703205377", 0),
    ("large numbers", r"10^{100}", B % r"10^{100}+1", 0),
    ("large numbers", r"3 \cdot 10^{8}", B % "300,000,000", 1),
    ("large numbers", r"3 \cdot 10^{8}", B % "300,000,001", 0),
    ("large numbers", "1.5e-20", B % r"1.5 \times 10^{-20}", 1),
    ("large numbers", "1.5e-20", B % r"1.6 \times 10^{-20}", 0),
    ("large numbers", "100!", B % "100!", 1),
    ("large numbers", "100!", B % "101!", 0),
    # --- attempts to game the verifier: hedges, ranges, variables, lists (all must score 0) ---
    ("adversarial", "5", B % r"5 \text{ or } 6", 0),
    ("adversarial", "5", B % "5, 6", 0),
    ("adversarial", "5", r"\boxed{5}\text{ or }\boxed{6}", 0),
    ("adversarial", "5", r"\boxed{5}\boxed{6}", 0),
    ("adversarial", "5", B % r"\{5, 6\}", 0),
    ("adversarial", "5", B % "x", 0),
    ("adversarial", "5", B % "5 = 6", 0),
    ("adversarial", "5", B % "4 < x < 6", 0),
    ("adversarial", "5", B % "[4, 6]", 0),
    ("adversarial", "5", B % r"5 \pm 1", 0),
    ("adversarial", "5", B % r"x \in \mathbb{R}", 0),
    ("adversarial", "5", B % r"x = 5 \text{ or } x = 6", 0),
    ("adversarial", "x = 5", B % "x", 0),
    ("adversarial", r"\text{(A)}", B % "A, B, C", 0),
    ("adversarial", r"\text{Evelyn}", B % r"\text{Evelyn or Carla}", 0),
    ("adversarial", "7", " ".join(rf"\boxed{{{i}}}," for i in range(1, 20)), 0),
    # --- extraction and format policy ---
    ("format policy", "73", "The answer is **73**.", 0),
    ("format policy", "73", "The answer is 73.", 0),
    ("format policy", "73", r"\boxed{73}", 1),
    ("format policy", "73", "#### 73", 1),
    ("format policy", "73", r"\boxed{}", 0),
    ("format policy", "73", r"The answer is \boxed{73", 0),
    ("format policy", "73", r"\boxed{73} is wrong; it is \boxed{37}", 0),
    # --- three false-negative kinds: a decimal comma in the gold, a superscript unit, a heavy expression ---
    ("i25 decimal comma in the gold", "1,22", B % "1.22", 1),
    ("i25 decimal comma in the gold", "1,22", B % "1.23", 0),
    ("i25 superscript unit", "1000.99", B % "1,000.99m²", 1),
    ("i25 superscript unit", "1000.99", B % "1,001.99m²", 0),
    (
        "i25 heavy expression",
        r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}",
        B % r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}",
        1,
    ),
    (
        "i25 heavy expression",
        r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}",
        B % r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{16+2\sqrt{33}}",
        0,
    ),
]


def math_verify_alone(gold_raw: object, response: str) -> float:
    """A last-box-only grader: last box of each side, math-verify's parse and verify, nothing else."""
    gold = extract_boxed(gold_raw) if isinstance(gold_raw, str) and extract_boxed(gold_raw) else None
    if gold is None:
        gold = extract_gold(gold_raw) if "\\boxed" not in str(gold_raw) else str(gold_raw)
    answer = extract_boxed(response)
    if answer is None and "####" in response:
        answer = response.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        return 0.0
    g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    p = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    return float(bool(g and p and verify(g, p, timeout_seconds=None)))


def report(name: str, cases: list, scores: list[float]) -> dict[str, int]:
    per_category: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    fp = fn = 0
    misses = []
    for (category, gold, response, expected), got in zip(cases, scores, strict=True):
        agree = int(got) == expected
        per_category[category][0] += agree
        per_category[category][1] += 1
        if not agree:
            fp += got == 1.0
            fn += got == 0.0
            misses.append(f"    {'FP' if got else 'FN'} [{category}] gold={gold!r} response={response!r}")
    agreed = sum(a for a, _ in per_category.values())
    print(
        f"\n== {name}: agreement {agreed}/{len(cases)} = {agreed / len(cases):.1%}, false positives {fp}, "
        f"false negatives {fn}"
    )
    for category, (a, n) in per_category.items():
        print(f"    {category:28s} {a:3d}/{n:3d}")
    print("\n".join(misses) if misses else "    (no disagreement)")
    return {"agreed": agreed, "cases": len(cases), "false_positives": fp, "false_negatives": fn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the first case of each category")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    cases = CASES
    if args.quick:
        seen: set[str] = set()
        cases = [c for c in CASES if not (c[0] in seen or seen.add(c[0]))]
    print(f"{len(cases)} cases in {len({c[0] for c in cases})} categories")

    inputs = [RewardInput(response, extract_gold(gold)) for _, gold, response, _ in cases]
    with RewardScorer(RewardConfig(components={"math_correctness": 1.0})) as scorer:
        results = scorer.score(inputs)
    bad = [r.status for r in results if r.status != "ok"]
    if bad:
        print(f"{len(bad)} items not scored ok: {sorted(set(bad))}")
    ours = report("mugrpo (extract_gold + RewardScorer)", cases, [r.reward for r in results])
    report("math-verify alone, last box", cases, [math_verify_alone(g, r) for _, g, r, _ in cases])
    target_met = ours["agreed"] / ours["cases"] >= 0.98 and ours["false_positives"] == 0
    print(f"\ntarget (agreement >= 98%, zero false positives): {'met' if target_met else 'NOT met'}")


if __name__ == "__main__":
    main()
