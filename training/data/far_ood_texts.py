"""Far-OOD text kinds for the OOD-validation families (docs/method.md, "The kernel's signal beside the exact backbone"):
inputs no prose model should take for its own, generated from a seed so that they exist offline on every machine.
A score chosen on prose-like families alone can rank gibberish as more in-distribution than a product review; these
families let the choice see it.

- ``random_strings``: strings of random letters, digits and punctuation, word-like lengths;
- ``other_scripts``: words of random letters from non-Latin scripts (Cyrillic, Greek, Arabic, Hebrew, Devanagari,
  Thai, CJK, Hangul), some with Latin words mixed in;
- ``numbers_and_tables``: rows of numbers, dates, amounts and CSV / pipe-table lines;
- ``markup_and_urls``: HTML / XML fragments, URLs, e-mail headers and JSON.

Each returns ``n`` texts; the same seed gives the same texts.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

SCRIPTS = {  # (first, last) code points of letters
    "cyrillic": (0x0430, 0x044F), "greek": (0x03B1, 0x03C9), "arabic": (0x0627, 0x064A), "hebrew": (0x05D0, 0x05EA),
    "devanagari": (0x0915, 0x0939), "thai": (0x0E01, 0x0E2E), "cjk": (0x4E00, 0x9FA5), "hangul": (0xAC00, 0xD7A3),
}
LATIN_WORDS = ("the", "and", "model", "data", "film", "review", "of", "to")
TAGS = ("div", "span", "p", "a", "td", "tr", "li", "ul", "section", "item", "entry", "title")
DOMAINS = ("example.com", "docs.example.org", "cdn.example.net", "api.example.io", "mail.example.de")


def _words(rng: random.Random, make: Callable[[], str], low: int = 3, high: int = 14) -> str:
    return " ".join(make() for _ in range(rng.randint(low, high)))


def random_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "!?.,;:-_#@%&*()"
    return [_words(rng, lambda: "".join(rng.choices(alphabet, k=rng.randint(2, 10)))) for _ in range(n)]


def other_scripts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def word(first: int, last: int) -> str:
        if rng.random() < 0.1:
            return rng.choice(LATIN_WORDS)
        return "".join(chr(rng.randint(first, last)) for _ in range(rng.randint(1, 8)))

    scripts = [SCRIPTS[rng.choice(sorted(SCRIPTS))] for _ in range(n)]
    return [_words(rng, lambda first=first, last=last: word(first, last)) for first, last in scripts]


def numbers_and_tables(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def number() -> str:
        kind = rng.randrange(5)
        if kind == 0:
            return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        if kind == 1:
            return f"{rng.uniform(-1e4, 1e4):,.2f}"
        if kind == 2:
            return f"{rng.uniform(0, 100):.1f}%"
        if kind == 3:
            return f"${rng.randint(1, 99999)}"
        return str(rng.randint(0, 10**rng.randint(1, 9)))

    separators = (", ", " | ", "\t", " ", ";")
    return [rng.choice(separators).join(number() for _ in range(rng.randint(3, 12))) for _ in range(n)]


def markup_and_urls(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def path() -> str:
        return "/".join("".join(rng.choices(string.ascii_lowercase + string.digits, k=rng.randint(2, 8)))
                        for _ in range(rng.randint(1, 4)))

    def one() -> str:
        kind = rng.randrange(4)
        if kind == 0:
            tag = rng.choice(TAGS)
            return (f'<{tag} class="{path()}" id="x{rng.randint(1, 999)}"><{rng.choice(TAGS)}>{rng.randint(0, 99)}'
                    f"</{rng.choice(TAGS)}></{tag}>")
        if kind == 1:
            return " ".join(f"https://{rng.choice(DOMAINS)}/{path()}?id={rng.randint(1, 10**6)}"
                            for _ in range(rng.randint(1, 3)))
        if kind == 2:
            return (f"From: {path().split('/')[0]}@{rng.choice(DOMAINS)} Message-ID: <{rng.getrandbits(48):x}@"
                    f"{rng.choice(DOMAINS)}> Content-Type: text/plain; charset=utf-8")
        fields = (f'"{path().split("/")[0]}": {rng.randint(0, 999)}' for _ in range(rng.randint(2, 6)))
        return "{" + ", ".join(fields) + "}"

    return [one() for _ in range(n)]


FAR_OOD_KINDS = {  # family name -> (generator, description)
    "random_strings": (random_strings, "random character strings (OOD validation only)"),
    "other_scripts": (other_scripts, "words in non-Latin scripts (OOD validation only)"),
    "numbers_and_tables": (numbers_and_tables, "numbers, dates and table rows (OOD validation only)"),
    "markup_and_urls": (markup_and_urls, "HTML / JSON fragments, URLs and mail headers (OOD validation only)"),
}
