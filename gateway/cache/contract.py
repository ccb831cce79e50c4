"""The contract veto: before any score, two questions must agree on what makes answers differ.

A semantic hit serves the answer to another question. Whatever similarity model scores the
pair, some differences change every answer while barely moving the score (a bi-encoder pools
words and scarcely sees one changed digit or their order). Such pairs are refused outright:

- **numbers**: the digits, number words, months, weekdays and units ("10 km" / "12 km",
  "5 kg" / "5 pounds", "in May" / "in June"), as multisets;
- **negation**: one question negated ("not", "n't", "never", "without", ...), the other not;
- **names and identifiers**: a capitalised word inside a sentence, a well-known name written
  in any case (countries, languages, cities, companies, technologies), or an identifier
  (``snake_case``, ``camelCase``, ``file.ext``, a URL or an e-mail address) that the other
  question lacks;
- **direction**: the two sides of "X to Y", "X into Y", "from X to Y", "X vs Y", "X than Y"
  in the other order ("convert Celsius to Fahrenheit" / "... Fahrenheit to Celsius");
- **polarity**: a word in one and its antonym in its place in the other (before / after,
  best / worst, buy / sell, pros / cons, ...).

The idea is the "minimal pair" of contrast sets (Gardner et al. 2020, "Evaluating Models'
Local Decision Boundaries via Contrast Sets"; Ribeiro et al. 2020, CheckList) turned from a
test into a rule. It trades recall for the contract: about one QQP pair in eight labelled
duplicate differs in such a term (many are loose labels, "iPhone 6" / "iPhone 7") and is
refused. Pure functions, no I/O; about 20 us a pair (``Terms`` of a cached question can be
kept with it).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["Terms", "terms", "veto"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD = re.compile(r"[^\W_][\w+#.'@]*[\w+#]|[^\W_]")
_NUMBER = re.compile(r"^\d[\d,]*(?:\.\d+)?$")
_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
_CARDINALS = ("zero one two three four five six seven eight nine ten eleven twelve "
              "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty")
_TENS = "thirty forty fifty sixty seventy eighty ninety"
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_CARDINALS.split())} | {
    w: str(10 * i) for i, w in enumerate(_TENS.split(), 3)} | dict.fromkeys(_words(
        "hundred thousand million billion trillion dozen twice thrice triple third fourth "
        "fifth sixth seventh eighth ninth tenth"), "")
#: Number words that are mostly something else ("how does one ...", "one of the best").
_AMBIGUOUS_NUMBERS = frozenset({"one", "zero"})
_DATES = _words(
    "january february march april june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday "
    "friday saturday sunday")
_UNITS = _words(
    "celsius fahrenheit kelvin km kms kilometer kilometers kilometre kilometres mile miles "
    "meter meters metre metres m cm mm inch inches foot feet ft yard yards kg kgs kilogram "
    "kilograms g gram grams lb lbs pound pounds ounce ounces oz ton tons tonne tonnes liter "
    "liters litre litres ml gallon gallons dollar dollars usd rupee rupees inr rs euro euros "
    "eur pound sterling gbp yen yuan bitcoin btc second seconds minute minutes hour hours "
    "day days week weeks month months year years decade decades century centuries kb mb gb "
    "tb byte bytes bit bits kbps mbps gbps hz khz mhz ghz mph kmph kph watt watts kw kwh volt "
    "volts amp amps calorie calories kcal percent binary decimal hexadecimal octal")
_NEGATIONS = _words(
    "not no never none nobody nothing neither nor nowhere without cannot cant dont doesnt "
    "didnt isnt arent wasnt werent wont wouldnt shouldnt couldnt havent hasnt hadnt mustnt "
    "neednt aint")
_DIRECTION = frozenset({"to", "into", "than", "vs", "vs.", "versus"})
_SKIP = frozenset({"a", "an", "the", "my", "your", "our", "their", "his", "her", "its",
                   "this", "that", "these", "those", "some", "any"})
_ANTONYMS = {
    "before": "after", "best": "worst", "more": "less", "most": "least", "increase":
    "decrease", "always": "never", "first": "last", "above": "below", "maximum": "minimum",
    "max": "min", "cheapest": "expensive", "easiest": "hardest", "fastest": "slowest",
    "biggest": "smallest", "largest": "smallest", "richest": "poorest", "advantages":
    "disadvantages", "advantage": "disadvantage", "pros": "cons", "buy": "sell", "win":
    "lose", "gain": "lose", "start": "stop", "positive": "negative", "good": "bad",
    "better": "worse", "higher": "lower", "legal": "illegal", "with": "without", "men":
    "women", "man": "woman", "male": "female", "past": "future", "boy": "girl", "boys":
    "girls", "husband": "wife", "old": "new", "oldest": "newest", "import": "export",
    "upload": "download", "input": "output", "north": "south", "east": "west", "true":
    "false", "up": "down", "early": "late", "inside": "outside", "open": "close",
    "rich": "poor", "hot": "cold", "cheap": "expensive", "safe": "unsafe", "possible":
    "impossible", "happy": "sad", "love": "hate", "strong": "weak", "top": "bottom",
}
_POLAR = {**_ANTONYMS, **{v: k for k, v in _ANTONYMS.items()}}
#: Names a question may write in lower case ("jobs in india"): countries, languages, big
#: cities, companies and technologies; a capitalised word counts as a name wherever it is.
_NAMES = _words(
    "india china france germany japan canada australia brazil russia italy spain mexico "
    "pakistan usa uk america england britain singapore nepal sweden ireland israel korea "
    "bangladesh indonesia dubai uae egypt nigeria kenya iran iraq turkey greece poland "
    "netherlands norway denmark finland switzerland austria belgium portugal argentina chile "
    "english french german spanish hindi chinese japanese russian italian arabic portuguese "
    "korean tamil urdu telugu bengali marathi punjabi sanskrit latin mandarin "
    "delhi mumbai bangalore bengaluru chennai london paris berlin tokyo boston chicago "
    "seattle sydney toronto hyderabad pune kolkata beijing moscow california texas york "
    "florida "
    "google facebook amazon apple microsoft quora twitter uber netflix samsung infosys "
    "flipkart ibm intel tesla oracle tcs wipro accenture youtube instagram whatsapp "
    "linkedin snapchat reddit wikipedia paypal "
    "python java javascript php ruby android ios windows linux matlab sql excel iphone "
    "ipad photoshop hadoop c++ c# swift kotlin golang rust scala perl html css mysql "
    "django react angular node nodejs spark tensorflow macos ubuntu "
    "trump modi obama hillary clinton gandhi einstein newton shakespeare putin musk "
    "gates zuckerberg kejriwal")
_IDENTIFIER = re.compile(r"\w_\w|[a-z][A-Z]|\w\.[A-Za-z]{1,5}$|://|@\w|\w/\w")
#: Words that are never names, however written ("Or", "What", "If", "I'm").
_NOT_NAMES = _NEGATIONS | _SKIP | _words(
    "i im ive id ill or and if but so what why how when where who whom whose which is are "
    "was were be been do does did can could should would will shall may might must has have "
    "had in on at of for by with about as it its he she we they you me him them us yes "
    "please hi hello question note edit update best new")
_SENTENCE_END = frozenset('.?!:;("-*')


@dataclass(frozen=True, slots=True)
class Terms:
    """What a question pins down: ``numbers`` (sorted: digits, number words, dates, and units
    next to a number), ``units`` (every unit word), ``negations`` (how many), ``names`` (lower-cased),
    ``words`` (every word, lower-cased, in order), ``pairs`` ((left, right) around each
    direction word), ``polar`` (polarity words)."""

    numbers: tuple[str, ...]
    units: frozenset[str]
    negations: int
    names: frozenset[str]
    words: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    polar: frozenset[str]


def _number(word: str) -> str:
    plain = word.replace(",", "")
    return plain.removesuffix(".0")


def _plain(word: str) -> str:
    w = word.lower().replace("\u2019", "'")
    return w.removesuffix("'s").replace("'", "")


def _starts_sentence(text: str, at: int) -> bool:
    """Whether the last non-blank character before ``at`` ends a sentence (or opens a quote,
    a parenthesis, a list item)."""
    k = at - 1
    while k >= 0 and text[k].isspace():
        k -= 1
    return k >= 0 and text[k] in _SENTENCE_END


def terms(text: str) -> Terms:
    """``text``'s terms (pure; ``text`` any string)."""
    found = list(_WORD.finditer(text))
    raw = [m.group(0) for m in found]
    lower = tuple(_plain(w) for w in raw)
    long = [w for w in raw if len(w) > 3]
    titled = len(long) >= 4 and sum(w[:1].isupper() for w in long) > 0.6 * len(long)
    numbers: list[str] = []
    units: set[str] = set()
    names: set[str] = set()
    for i, (m, w, lw) in enumerate(zip(found, raw, lower, strict=True)):
        if _DIGITS.search(w):
            numbers.extend(_number(d) for d in _DIGITS.findall(w))
        elif lw in _NUMBER_WORDS and lw not in _AMBIGUOUS_NUMBERS:
            numbers.append(_NUMBER_WORDS[lw] or lw)
        elif lw in _DATES:
            numbers.append(lw)
        elif lw in _UNITS:
            units.add(lw)
            if i > 0 and (_NUMBER.match(raw[i - 1]) or lower[i - 1] in _NUMBER_WORDS):
                numbers.append(lw)
        if lw in _NOT_NAMES:
            continue
        if lw in _NAMES or _IDENTIFIER.search(w) or (
                not titled and w[:1].isupper() and i > 0
                and not _starts_sentence(text, m.start())):
            names.add(lw)
    pairs: list[tuple[str, str]] = []
    for i, lw in enumerate(lower):
        if lw in _DIRECTION and 0 < i < len(lower) - 1:
            j = i + 1
            while j < len(lower) - 1 and lower[j] in _SKIP:
                j += 1
            left, right = lower[i - 1], lower[j]
            if left != right and left not in _SKIP:
                pairs.append((left, right))
    return Terms(tuple(sorted(numbers)), frozenset(units),
                 sum(lw in _NEGATIONS for lw in lower), frozenset(names), lower,
                 tuple(pairs), frozenset(lw for lw in lower if lw in _POLAR))


def _order_flipped(a: Terms, b: Terms) -> bool:
    """A direction pair of ``a`` whose sides come in the other order in ``b``."""
    if not a.pairs:
        return False
    first: dict[str, int] = {}
    for i, w in enumerate(b.words):
        first.setdefault(w, i)
    return any(x in first and y in first and first[y] < first[x] for x, y in a.pairs)


def _polarity_flipped(a: Terms, b: Terms) -> bool:
    return any(w not in b.polar and _POLAR[w] in b.polar and _POLAR[w] not in a.polar
               for w in a.polar)


def _names_swapped(a: Terms, b: Terms) -> bool:
    """One name put for another: a name fewer times in ``b`` than in ``a`` and another more
    (a name only dropped or added is left to the similarity: paraphrases often do that)."""
    names = a.names | b.names
    ca, cb = Counter(w for w in a.words if w in names), Counter(w for w in b.words if w in names)
    return any(ca[n] > cb[n] for n in names) and any(cb[n] > ca[n] for n in names)


def veto(a: Terms, b: Terms) -> str | None:
    """Why ``a`` and ``b`` cannot share an answer (``number``, ``negation``, ``entity``,
    ``direction``, ``polarity``), or None when the contract holds."""
    if a.numbers != b.numbers or (a.units and b.units and a.units != b.units):
        return "number"
    if a.negations != b.negations:
        return "negation"
    if a.names != b.names and _names_swapped(a, b):
        return "entity"
    if _order_flipped(a, b) or _order_flipped(b, a) or (
            a.words != b.words and sorted(a.words) == sorted(b.words)):
        return "direction"
    if _polarity_flipped(a, b) or _polarity_flipped(b, a):
        return "polarity"
    return None
