"""A generated corpus of customer-support messages full of realistic PII, with its ground-truth spans.

:func:`support_dialogues` makes the text task's data (``featuredp compare --task text``): every value is synthetic
and reproducible from a public seed, so the audits know exactly which characters are private.
"""

from __future__ import annotations

import string
import unicodedata

import numpy as np

from featuredp._validate import check_int
from featuredp.data.text import TextRecord
from featuredp.features.text import Span

__all__ = ["generator_names", "luhn_valid", "support_dialogues"]



_FIRST = (
    "Maria", "James", "Aisha", "Wei", "Olga", "Carlos", "Priya", "Tomasz", "Fatima", "Liam", "Sofia", "Kenji",
    "Amara", "Lucas", "Ingrid", "Mateo", "Chloé", "José", "Zoë", "Łukasz", "Søren", "Noor", "Yusuf", "Elena",
    "Dmitri", "Hannah", "Arjun", "Mei", "Kwame", "Nadia", "Oliver", "Leila", "Rafael", "Svetlana", "Tariq",
    "Emeka", "Freya", "Hiroshi", "Isabel", "Jonas", "Keiko", "Lars", "Mónica", "Nikos", "Oksana", "Pablo",
    "Quentin", "Rosa", "Sven", "Thandiwe", "Ulrich", "Valentina", "Wanjiru", "Xiulan", "Yara", "Zainab", "Björn",
    "Anaïs", "Siobhán", "Ahmed", "Bruno", "Camille", "Diego", "Esther", "Gabriel", "Ines", "Javier", "Katarzyna",
)  # fmt: skip
_LAST = (
    "Lopez", "Smith", "Nguyen", "Kowalski", "Okafor", "Müller", "García", "Patel", "Ivanova", "Johansson",
    "Rossi", "Tanaka", "Mensah", "Dubois", "Kim", "Haddad", "Silva", "O'Brien", "Novak", "Fischer", "Andersen",
    "Moreau", "Schmidt", "Chen", "Wójcik", "Costa", "Petrov", "Yilmaz", "Mwangi", "Kaur", "Sato", "Hughes",
    "Brennan", "Castillo", "Lindqvist", "Horvat", "Achterberg", "Nakamura", "Osei", "Ferreira", "Jovanović",
    "Kovacs", "Lambert", "Mahmoud", "Nowak", "Ortega", "Pereira", "Quinn", "Reyes", "Santos", "Takahashi", "Ueda",
    "Vargas", "Weber", "Xu", "Yamamoto", "Zhang", "Abebe", "Bianchi", "Dlamini", "Eriksen", "Fontaine",
)  # fmt: skip
_STREETS = (
    "Oak", "Maple", "Cedar", "Elm", "Pine", "Willow", "Birch", "Chestnut", "Hawthorn", "Juniper", "Magnolia",
    "Sycamore", "Poplar", "Alder", "Laurel", "Rowan", "Aspen", "Linden", "Spruce", "Cypress", "Holly", "Meadow",
    "River", "Lake", "Hill", "Park", "Church", "Mill", "Station", "Bridge", "Harbor", "Orchard", "Valley",
    "Forest", "Sunset", "Highland", "Railway", "King", "Queen", "Market",
)  # fmt: skip
_SUFFIXES = ("Street", "St", "Avenue", "Ave", "Road", "Rd", "Lane", "Drive", "Court", "Place", "Way", "Blvd")
_CITIES = (
    "Springfield", "Riverside", "Portland", "Leeds", "Lyon", "Graz", "Porto", "Austin", "Denver", "Malmö",
    "Kraków", "Cork", "Bergen", "Turin", "Ghent", "Halifax", "Dunedin", "Perth", "Utrecht", "Brno",
)  # fmt: skip
_DOMAINS = (
    "gmail.com", "yahoo.com", "hotmail.com", "outlook.com", "proton.me", "icloud.com", "gmx.de", "web.de",
    "orange.fr", "libero.it", "mail.ru", "qq.com", "naver.com", "btinternet.com", "comcast.net", "aol.com",
    "zoho.com", "fastmail.com", "posteo.de", "seznam.cz", "wp.pl", "telenet.be", "example.com", "shop-mail.co.uk",
)  # fmt: skip
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip
_US_AREAS = (212, 213, 305, 312, 404, 415, 503, 512, 617, 646, 702, 718, 720, 808, 917, 929)

#: the templates; a field is {name} (full name), {first}, {email}, {phone}, {card}, {address}, {date} or {order}
_TEMPLATES = (
    "Customer: Hi, I'm {name}, order {order} never came. Call me at {phone}.",
    "Customer: Please change my email to {email}. Thanks, {first}.",
    "Customer: My card {card} was charged twice for order {order}.",
    "Customer: I moved to {address}. Can you ship order {order} there?",
    "Agent: Thanks {first}, we'll email {email} once it ships.",
    "Customer: This is {name}. My package for {address} is late.",
    "Customer: It's {name}, born {date}. Why can't I log in?",
    "Agent: Can I get your phone number? Customer: Sure, {phone}.",
    "Customer: Please refund order {order} to card {card}.",
    "Agent: Hello {first}, your order {order} arrives on {date}.",
    "Customer: Wrong address on order {order}. It should be {address}.",
    "Customer: Hi, {name} here. Reach me at {email} or {phone}.",
    "Agent: I've updated the billing address to {address}, {first}.",
    "Customer: Order {order} was delivered on {date} but the box was empty.",
    "Customer: Can you remove card {card} from my account? {first}",
    "Agent: Your refund for order {order} was sent on {date}.",
    "Customer: I never placed order {order}! My email is {email}.",
    "Customer: Hello, my name is {name} and my number changed to {phone}.",
    "Agent: Please confirm your date of birth. Customer: {date}.",
    "Customer: Send the invoice to {email}, attn {name}.",
    "Customer: The courier left order {order} at {address} instead.",
    "Agent: We charged {card} on {date}. Is that right, {first}?",
    "Customer: hey its {first} again, still waiting on {order}",
    "Customer: Please call {phone} after 5pm and ask for {first}.",
    "Agent: {first}, your new card {card} is now the default.",
    "Customer: Do you deliver to {address}? I'm {name}.",
    "Customer: My account {email} has been locked since {date}.",
    "Agent: Order {order} for {name} is out for delivery today.",
    "Customer: Cancel order {order} please, I paid with {card}.",
    "Cliente: Hola, soy {name}. Mi pedido {order} no llegó.",
    "Kunde: Hallo, hier ist {name}. Meine Bestellung {order} fehlt.",
    "Client : Bonjour, je suis {name}, joignable au {phone}.",
    "Customer: Text me at {phone} when order {order} ships.",
    "Agent: Got it {first}, the parcel goes to {address}.",
    "Customer: new phone {phone}, same email {email}",
    "Agent: Verified. Card {card}, holder {name}.",
)  # fmt: skip
_FIELD_TYPES = {"name": "name", "first": "name", "email": "email", "phone": "phone", "card": "card",
                "address": "address", "date": "date", "order": "number"}  # fmt: skip
_ASCII = str.maketrans({"ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "ß": "ss", "æ": "ae", "đ": "d", "'": ""})


def luhn_valid(number: str) -> bool:
    """Whether the digits of ``number`` (separators ignored) pass the Luhn check of card numbers.

    >>> luhn_valid("4111 1111 1111 1111"), luhn_valid("4111 1111 1111 1112")
    (True, False)
    """
    digits = [int(c) for c in number if c.isdigit()]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return bool(digits) and total % 10 == 0


def _luhn_complete(body: str) -> str:
    """``body`` with the check digit that makes it Luhn-valid."""
    for check in "0123456789":
        if luhn_valid(body + check):
            return body + check
    raise AssertionError("unreachable: one check digit always works")


def _digits(rng: np.random.Generator, n: int) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, n))


def _card(rng: np.random.Generator) -> str:
    kind = int(rng.integers(0, 4))
    if kind == 3:  # American Express: 15 digits, 4-6-5
        number = _luhn_complete(str(rng.choice(["34", "37"])) + _digits(rng, 12))
        groups = [number[:4], number[4:10], number[10:]]
    else:  # Visa, Mastercard, Discover: 16 digits, 4-4-4-4
        prefix = ("4", str(rng.integers(51, 56)), "6011")[kind]
        number = _luhn_complete(prefix + _digits(rng, 15 - len(prefix)))
        groups = [number[i : i + 4] for i in range(0, 16, 4)]
    return str(rng.choice([" ", "-", ""])).join(groups)


def _phone(rng: np.random.Generator) -> str:
    area = int(rng.choice(_US_AREAS))
    exchange, line = int(rng.integers(200, 1000)), int(rng.integers(0, 10000))
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return f"{area}-{exchange}-{line:04d}"
    if kind == 1:
        return f"({area}) {exchange}-{line:04d}"
    if kind == 2:
        return f"{area}.{exchange}.{line:04d}"
    if kind == 3:
        return f"+1 {area} {exchange} {line:04d}"
    if kind == 4:  # London
        return f"+44 20 {rng.integers(7000, 8000)} {rng.integers(0, 10000):04d}"
    return f"+49 30 {rng.integers(1000, 10000)} {rng.integers(0, 10000):04d}"  # Berlin


def _date(rng: np.random.Generator) -> str:
    year, month, day = int(rng.integers(1950, 2026)), int(rng.integers(1, 13)), int(rng.integers(1, 29))
    kind = int(rng.integers(0, 6))
    if kind == 0:
        return f"{_MONTHS[month - 1]} {day}, {year}"
    if kind == 1:
        return f"{day} {_MONTHS[month - 1]} {year}"
    if kind == 2:
        return f"{year}-{month:02d}-{day:02d}"
    if kind == 3:
        return f"{month:02d}/{day:02d}/{year}"
    if kind == 4:
        return f"{day:02d}.{month:02d}.{year}"
    return f"{_MONTHS[month - 1][:3]} {day}, {year}"


def _address(rng: np.random.Generator) -> str:
    street = f"{rng.integers(1, 10000)} {rng.choice(_STREETS)} {rng.choice(_SUFFIXES)}"
    return f"{street}, {rng.choice(_CITIES)}" if rng.random() < 0.4 else street


def _ascii(s: str) -> str:
    folded = unicodedata.normalize("NFKD", s.translate(_ASCII))
    return "".join(c for c in folded if c.isascii() and c.isalnum()).lower()


def _email(rng: np.random.Generator, first: str, last: str) -> str:
    f, last_ = _ascii(first), _ascii(last)
    local = (f"{f}.{last_}", f"{f}{last_}", f"{f[0]}.{last_}", f"{f}_{last_}", f"{f}{rng.integers(10, 100)}",
             f"{last_}.{f}", f"{f[0]}{last_}{rng.integers(1, 10)}")[int(rng.integers(0, 7))]  # fmt: skip
    return f"{local}@{rng.choice(_DOMAINS)}"


def _fill(template: str, values: dict[str, str]) -> TextRecord:
    """The template with its fields filled, and a span of each field's type over each filled value."""
    parts: list[str] = []
    spans: list[Span] = []
    at = 0
    for literal, field_name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        at += len(literal)
        if field_name is not None:
            value = values[field_name]
            parts.append(value)
            spans.append(Span(at, at + len(value), _FIELD_TYPES[field_name]))
            at += len(value)
    return TextRecord("".join(parts), spans)


def support_dialogues(n: int, *, seed: int = 0, max_bytes: int = 120) -> list[TextRecord]:
    """``n`` generated customer-support messages full of PII, with the ground-truth spans of every private value.

    Generator: ``numpy.random.default_rng(seed)``; per record a template is drawn uniformly from 36
    (English, with a Spanish, a German and a French one), a person from built-in lists (68 first names, 62
    surnames, some non-ASCII), and each field the template has: ``name`` (full name or first name alone),
    ``email`` (from the person's name, 7 local-part forms, 24 domains), ``phone`` (US in 4 formats, London and
    Berlin in international form), ``card`` (Visa, Mastercard, Discover 4-4-4-4 or Amex 4-6-5, Luhn-valid, space-,
    dash- or un-separated), ``address`` (house number, street, suffix, sometimes a city), ``date`` (6 formats,
    1950-2025) and ``number`` (an 8-digit order number). A record longer than ``max_bytes`` UTF-8 bytes is drawn
    again, so every text fits ``max_bytes + 2`` tokens with BOS and EOS (the texts are 50 to 100 bytes; a
    ``max_bytes`` below about 60 makes shorter templates likelier, and one below 50 is an error). Every value is
    synthetic; ``seed`` is public (the corpus is no one's data), and the same seed gives the same records on every
    machine.

    The values are written so that the built-in detectors of :mod:`featuredp.features.text` find exactly the
    ground-truth emails, phones, cards, dates and order numbers (names: given the name lists), so a Ψ that
    detects rather than reads the annotations can be checked against the truth.

    >>> all(len(r.text.encode()) <= 120 for r in support_dialogues(50))
    True
    """
    n = check_int("n", n, minimum=0)
    max_bytes = check_int("max_bytes", max_bytes, minimum=1)
    rng = np.random.default_rng(seed)
    out: list[TextRecord] = []
    misses = 0
    while len(out) < n:
        if misses > 10_000:  # the shortest messages are about 50 bytes; a limit below them would loop forever
            raise ValueError(f"max_bytes={max_bytes} is too small for the generated messages (most are 55 to 90 "
                             "bytes; use 80 or more)")  # fmt: skip
        template = _TEMPLATES[int(rng.integers(0, len(_TEMPLATES)))]
        first, last = str(rng.choice(_FIRST)), str(rng.choice(_LAST))
        values = {
            "name": f"{first} {last}" if rng.random() < 0.8 else first,
            "first": first,
            "email": _email(rng, first, last),
            "phone": _phone(rng),
            "card": _card(rng),
            "address": _address(rng),
            "date": _date(rng),
            "order": str(rng.integers(10_000_000, 100_000_000)),
        }
        record = _fill(template, values)
        if len(record.text.encode("utf-8")) <= max_bytes:
            out.append(record)
            misses = 0
        else:
            misses += 1
    return out


def generator_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The first names and surnames :func:`support_dialogues` draws from (for a name detector's list)."""
    return _FIRST, _LAST
