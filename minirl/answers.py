"""Final answers read out of model text, by the conventions graders use, strict and lenient.

    strict   the answer the text marks as final, in one of the conventions a task allows:
               "gsm8k"   #### 42            (GSM8K's reference solutions end this way)
               "answer"  Answer: 42         (also "The answer is: 42", "**Answer:** 42")
               "boxed"   \\boxed{42}         (MATH, DeepSeek-R1 style; nested braces allowed)
             the last marked answer in the text counts
    lenient  the last number anywhere in the text

Reporting both side by side separates "knows the answer" from "follows the format": a policy whose
lenient accuracy is far above its strict one has the arithmetic and lacks the format (what SFT or a
format reward fixes). Numbers compare by value, so "1,234", "1234.0", "$1,234" and "1234" are one
answer; anything else compares as text, lower-cased, with spaces collapsed and LaTeX \\text{} and $
signs removed.
"""

import re
from fractions import Fraction

CONVENTIONS = ("gsm8k", "answer", "boxed")
_NUMBER = r"[-−]?\$?\d[\d,]*(?:\.\d+)?"
_MARKED = {
    "gsm8k": re.compile(r"####\s*(" + _NUMBER + ")"),
    "answer": re.compile(r"\banswer(?:\s+is)?\s*\**\s*[:：]\s*\**\s*(" + _NUMBER + ")", re.I),
}
_NUMBER_ANYWHERE = re.compile(_NUMBER)


def value(text: str) -> Fraction | str | None:
    """One answer as a comparable value: a number (exact, as a Fraction) when it reads as one, else
    normalized text; None when there is nothing."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise TypeError("an answer cannot be a boolean")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(repr(text))  # 0.1 as written, not the nearest double
    clean = (
        re.sub(r"\\text\{([^}]*)\}", r"\1", str(text))
        .replace("\\$", "")
        .replace("$", "")
        .replace("−", "-")
    )
    clean = clean.replace("\\%", "").replace("%", "").strip().rstrip(".")
    number = clean.replace(",", "").replace(" ", "")
    try:
        return Fraction(number)
    except (ValueError, ZeroDivisionError):
        frac = re.fullmatch(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", number)
        if frac and int(frac.group(2)):
            return Fraction(int(frac.group(1)), int(frac.group(2)))
        return " ".join(clean.lower().split()) or None


def _boxed(text: str) -> list[tuple[int, str]]:
    """(position, content) of every \\boxed{...}, braces balanced."""
    found, start = [], text.find("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((start, text[start + len("\\boxed{") : i - 1]))
        start = text.find("\\boxed{", i if depth == 0 else start + 1)
    return found


def strict_answer(text: str, conventions=CONVENTIONS) -> Fraction | str | None:
    """The last answer `text` marks as final in one of `conventions` (module docstring), as a value."""
    unknown = set(conventions) - set(CONVENTIONS)
    if unknown:
        raise ValueError(
            f"unknown answer convention(s) {sorted(unknown)}; choose from {', '.join(CONVENTIONS)}"
        )
    marked = [
        (m.start(), m.group(1))
        for name in conventions
        if name in _MARKED
        for m in _MARKED[name].finditer(text)
    ]
    # \boxed{72 \text{ apples}} and \boxed{x = 5} hold one number: that is the answer
    if "boxed" in conventions:
        marked += [
            (i, numbers[0] if len(numbers := _NUMBER_ANYWHERE.findall(content)) == 1 else content)
            for i, content in _boxed(text)
        ]
    return value(max(marked)[1]) if marked else None


def lenient_answer(text: str) -> Fraction | None:
    """The last number anywhere in `text`, as a value."""
    found = _NUMBER_ANYWHERE.findall(text)
    return value(found[-1].rstrip(",")) if found else None


def reference_answer(answer) -> Fraction | str:
    """A dataset's answer field as a value: a number, a GSM8K solution ending in "#### 42", or text."""
    if isinstance(answer, str) and "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    result = value(answer)
    if result is None:
        raise ValueError(f"empty answer {answer!r}")
    return result
