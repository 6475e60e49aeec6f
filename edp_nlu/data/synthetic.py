"""The built-in synthetic smart-home corpus: the default data, generated, nothing downloaded.

It imitates the private utterances the project is about (calling relatives, messaging,
prescriptions, appointments, video, alarms, weather) so that the default job exercises every
part of the system without a dataset. Properties the experiments rely on:

* deterministic for a seed (Python's `random.Random`; no hash-order dependence);
* lower-case tokens, well-formed BIO tags, 12 intents, 10 slot types;
* no token sequence occurs twice across train/dev/test, so test utterances are true
  non-members for membership attacks;
* many distinct slot values drawn with Zipf-like weights (a long tail of values seen once),
  phone numbers drawn at random, and rare templates: enough to overfit and to leak membership;
* optional canaries: secret-bearing utterances repeated in train only, plus as many controls
  from the same distribution that are in no split (the attack's non-members). Canaries use
  their own random stream, so adding them leaves the rest of the corpus unchanged.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Callable, Iterator, Sequence

from edp_nlu.data.corpus import OUTSIDE, Splits, Utterance
from edp_nlu.data.schema import LabelSchema


def _words(text: str) -> tuple[str, ...]:
    return tuple(value.strip() for value in text.split("|") if value.strip())


FIRST_NAMES = _words(
    "anna|ben|carla|david|elena|farid|grace|hiro|isabel|jamal|kate|liam|maria|nadia|oscar|"
    "priya|quentin|rosa|samir|tara|umar|vera|wei|ximena|yusuf|zoe|agnes|bruno|chloe|dmitri|"
    "emma|felix|greta|hassan|ingrid|jonas|keiko|leon|mei|nikos|olga|pedro|rania|stefan|tomas|"
    "ursula|victor|wanda|yara|zain|alice|boris|camille|diego|esther|frank|gloria|henry|ines|"
    "joao|karim|lucia|marco|nora|otto|paula|rahul|sofia|theo|uma|vikram|wendy|amir|bianca|"
    "carlos|dana|erik|fatima|gustav|helen|ivan|julia|kwame|lena|miguel|noor|omar|petra|raj|"
    "sven|tanya|ulrich|valentina|walter|yasmin|zora|arjun|beatrix|cyrus|daphne")
LAST_NAMES = _words(
    "smith|garcia|nguyen|kowalski|okafor|rossi|tanaka|schmidt|haddad|novak|silva|murphy|"
    "larsen|kim|dubois|ivanova|mensah|costa|fischer|patel|jensen|moreau|yilmaz|santos|wagner|"
    "cohen|romero|sato|bauer|nakamura|hughes|lindqvist|petrov|oconnor|mendes|weber|hansen|"
    "abbas|ferreira|kaur|brown|lopez|chen|muller|singh|andersen|martin|rahman|baker|reyes|"
    "wolf|keller|park|ali|evans|horvat|moretti|dimitrov|bianchi|sharma|zhang|obi|lund|"
    "fernandez|walsh|suzuki|kruger|vargas|popescu|eriksson|hoffmann|gallagher|alvarez|"
    "nowak|boateng|shapiro|laurent|demir|castillo|ahmed")
RELATIONS = _words("mom|mum|dad|grandma|grandpa|nana|auntie|uncle joe|aunt mary|granny")
MEDICATIONS = _words(
    "aspirin|ibuprofen|paracetamol|metformin|lisinopril|atorvastatin|amlodipine|omeprazole|"
    "levothyroxine|simvastatin|losartan|amoxicillin|warfarin|insulin|insulin glargine|"
    "prednisone|gabapentin|sertraline|citalopram|furosemide|bisoprolol|ramipril|clopidogrel|"
    "lansoprazole|salbutamol|montelukast|tramadol|codeine|diazepam|zopiclone|vitamin d|"
    "folic acid|iron tablets|fish oil|donepezil|memantine|allopurinol|colchicine|apixaban|"
    "rivaroxaban|digoxin|tamsulosin|finasteride|latanoprost|cetirizine|loratadine|"
    "hydrocortisone cream|eye drops|nicotine patches|calcium tablets|magnesium|propranolol|"
    "doxycycline|naproxen|pregabalin|fluoxetine|mirtazapine|quetiapine|spironolactone|"
    "glipizide")
CITIES = _words(
    "london|paris|berlin|madrid|rome|lisbon|dublin|vienna|prague|warsaw|budapest|athens|"
    "oslo|stockholm|helsinki|copenhagen|amsterdam|brussels|zurich|geneva|milan|naples|"
    "barcelona|seville|porto|lyon|marseille|munich|hamburg|cologne|krakow|gdansk|istanbul|"
    "cairo|nairobi|lagos|accra|cape town|johannesburg|tokyo|osaka|kyoto|seoul|beijing|"
    "shanghai|hong kong|singapore|bangkok|hanoi|mumbai|delhi|bangalore|karachi|dubai|"
    "tel aviv|new york|los angeles|san francisco|chicago|boston|seattle|miami|toronto|"
    "montreal|vancouver|mexico city|lima|bogota|buenos aires|sao paulo|rio de janeiro|"
    "sydney|melbourne|auckland|edinburgh|glasgow|manchester|leeds|bristol|cardiff|belfast")
TITLE_ADJECTIVES = _words(
    "silent|last|hidden|broken|golden|lost|dark|wild|secret|frozen|burning|little|long|"
    "crimson|quiet|endless|forgotten|electric|midnight|northern|bitter|bright|hollow|"
    "distant|final|glass|iron|lonely|paper|scarlet|stolen|sunken|velvet|wandering|white|"
    "young|ancient|blue|strange|crooked")
TITLE_NOUNS = _words(
    "river|kingdom|garden|detective|island|mountain|station|letter|winter|house|road|"
    "city|ocean|forest|machine|empire|bridge|doctor|witness|summer|harbour|village|queen|"
    "soldier|castle|storm|journey|mirror|orchard|valley|tower|promise|stranger|lighthouse|"
    "inheritance|voyage|academy|circus|frontier|horizon|desert|cellar|crown|baker|pilot|"
    "dream|shadow|song|hotel|archive")
MESSAGES = _words(
    "i will be late|running {minutes} minutes late|call me back|dinner is ready|"
    "happy birthday|see you {date}|i am on my way|i love you|can you pick me up|"
    "the doctor said i am fine|i took my pills|please bring milk|i am home|"
    "the appointment is at {time}|do not forget the keys|i miss you|thank you for the flowers|"
    "the nurse is coming {date}|let us meet at {time}|good night|i am at the pharmacy|"
    "my train is delayed|see you at {time}|the heating is broken|can you call the plumber|"
    "i need more {medication}|lunch {date}|i feel much better|the parcel arrived|"
    "are you coming {date}")
DOCTORS = _words(
    "the dentist|the optician|the physio|the gp|the nurse|the cardiologist|the podiatrist|"
    "the hygienist|the surgery|the clinic|the hearing clinic|the dermatologist")
WEEKDAYS = _words("monday|tuesday|wednesday|thursday|friday|saturday|sunday")
MONTHS = _words("january|february|march|april|may|june|july|august|september|october|"
                "november|december")
NUMBER_WORDS = _words("one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve")
PREFIXES = _words("hey|ok|hey assistant|um|so")
SUFFIXES = _words("please|thanks|thank you|for me")

MAX_SIZE = 200_000
MAX_DUPLICATES_IN_A_ROW = 10_000  # The generator is exhausted long before this many.

# Intent -> (weight, templates). `{slot}` words are filled by SLOT_GENERATORS; a template
# starting with "!" is rare (weight RARE_WEIGHT) to create rare combinations.
RARE_WEIGHT = 0.15
TEMPLATES: dict[str, tuple[float, tuple[str, ...]]] = {
    "make_call": (1.4, (
        "call {contact_name}", "phone {contact_name}", "ring {contact_name}",
        "call {contact_name} on {phone_number}", "dial {phone_number}", "call {phone_number}",
        "give {contact_name} a call", "i want to call {contact_name}",
        "place a call to {phone_number}", "!call {contact_name} on speaker",
        "!dial {contact_name} at home on {phone_number}", "get {contact_name} on the phone")),
    "video_call": (0.7, (
        "video call {contact_name}", "start a video call with {contact_name}",
        "facetime {contact_name}", "i want to see {contact_name} on video",
        "set up a video chat with {contact_name}", "!video call {contact_name} {date} at {time}",
        "join the video call with {contact_name}", "turn on the camera and call {contact_name}")),
    "send_message": (1.3, (
        "text {contact_name} {message}", "send a message to {contact_name} saying {message}",
        "tell {contact_name} {message}", "message {contact_name} that {message}",
        "send {message} to {contact_name}", "text {phone_number} {message}",
        "!send a text to {phone_number} saying {message}", "write to {contact_name} {message}")),
    "read_messages": (0.6, (
        "read my messages", "any new messages from {contact_name}",
        "read the last message from {contact_name}", "did {contact_name} text me {date}",
        "what did {contact_name} say", "check my messages", "do i have any messages",
        "read messages from {date}", "!read the message {contact_name} sent at {time}")),
    "refill_prescription": (0.9, (
        "refill my {medication} prescription", "order more {medication}",
        "i need a refill of {medication}", "renew my prescription for {medication} {dosage}",
        "request a repeat prescription for {medication}", "i am running out of {medication}",
        "order {medication} {dosage} from the pharmacy", "!get my {medication} delivered {date}",
        "reorder {medication}")),
    "medication_reminder": (0.9, (
        "remind me to take {medication} at {time}",
        "remind me to take {dosage} of {medication} at {time}",
        "set a reminder for {medication} {date} at {time}",
        "i need to take {dosage} of {medication} every day at {time}",
        "remind me about my {medication} at {time}",
        "!remind me {date} to take {dosage} {medication}",
        "add a reminder to take {medication} {dosage} at {time}")),
    "book_appointment": (0.9, (
        "book an appointment with {doctor} {date}",
        "book an appointment with {doctor} {date} at {time}",
        "schedule a visit to {doctor} {date}", "i need to see {doctor} {date}",
        "make an appointment with {doctor} at {time} {date}", "can i see {doctor} {date}",
        "!book {doctor} for {time}", "get me an appointment with {doctor}")),
    "cancel_appointment": (0.5, (
        "cancel my appointment with {doctor}", "cancel my appointment {date}",
        "cancel the {time} appointment with {doctor}", "i can not make it to {doctor} {date}",
        "call off my visit to {doctor}", "!delete the appointment {date} at {time}")),
    "play_video": (1.0, (
        "play {title}", "put on {title}", "watch {title}", "i want to watch {title}",
        "stream {title} on the tv", "show me {title}", "play the next episode of {title}",
        "!record {title} {date} at {time}", "resume {title}")),
    "set_alarm": (1.1, (
        "set an alarm for {time}", "wake me up at {time}", "set an alarm for {time} {date}",
        "wake me up {date} at {time}", "alarm at {time}", "i need to get up at {time}",
        "set my alarm to {time}", "!set an alarm {date} at {time} called {medication}")),
    "cancel_alarm": (0.4, (
        "cancel my alarm for {time}", "turn off the {time} alarm", "delete the alarm {date}",
        "no alarm {date}", "remove all alarms", "cancel the alarm")),
    "get_weather": (1.2, (
        "what is the weather in {city}", "what is the weather like {date}",
        "weather in {city} {date}", "will it rain in {city} {date}",
        "is it going to be sunny {date}", "how hot will it be in {city}",
        "do i need an umbrella {date}", "what is the forecast for {city}",
        "!how cold is it in {city} at {time}", "tell me the weather")),
}


class _ZipfChooser:
    """Picks from `values` with weights 1/(rank+1): a few common values, a long rare tail."""

    def __init__(self, values: Sequence[str], exponent: float = 0.9):
        self.values = tuple(values)
        self.cumulative = list(itertools.accumulate(
            1.0 / (rank + 1) ** exponent for rank in range(len(self.values))))

    def __call__(self, rng: random.Random) -> str:
        return rng.choices(self.values, cum_weights=self.cumulative)[0]


_first, _last, _relation = (_ZipfChooser(v) for v in (FIRST_NAMES, LAST_NAMES, RELATIONS))
_medication, _city, _doctor_kind = (_ZipfChooser(v) for v in (MEDICATIONS, CITIES, DOCTORS))
_title_adjective, _title_noun = _ZipfChooser(TITLE_ADJECTIVES), _ZipfChooser(TITLE_NOUNS)


def _contact_name(rng: random.Random) -> str:
    draw = rng.random()
    if draw < 0.5:
        return _first(rng)
    if draw < 0.8:
        return f"{_first(rng)} {_last(rng)}"
    return _relation(rng)


def _digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(count))


def _phone_number(rng: random.Random) -> str:
    style = rng.randrange(4)
    if style == 0:
        return "0" + _digits(rng, 10)
    if style == 1:
        return f"0{_digits(rng, 3)} {_digits(rng, 3)} {_digits(rng, 4)}"
    if style == 2:
        return f"{_digits(rng, 3)} {_digits(rng, 4)}"
    return f"+{rng.choice(('44', '33', '49', '1', '34', '39'))} {_digits(rng, 9)}"


def _dosage(rng: random.Random) -> str:
    style = rng.randrange(5)
    if style == 0:
        amount = rng.choice((5, 10, 20, 25, 40, 50, 75, 100, 150, 200, 250, 400, 500, 1000))
        return f"{amount} {rng.choice(('mg', 'milligrams'))}"
    if style == 1:
        count = rng.choice(NUMBER_WORDS[:4])
        return f"{count} {'tablet' if count == 'one' else 'tablets'}"
    if style == 2:
        return rng.choice(("half a tablet", "one capsule", "two capsules", "two puffs",
                           "one puff", "a spoonful"))
    if style == 3:
        return f"{rng.choice((2, 5, 10, 15, 20))} ml"
    return f"{rng.randrange(2, 41)} units"


def _ordinal(day: int) -> str:
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def _date(rng: random.Random) -> str:
    style = rng.randrange(6)
    if style == 0:
        return rng.choice(("today", "tomorrow", "tonight", "the day after tomorrow",
                           "next week", "this weekend", "next weekend"))
    if style == 1:
        return rng.choice(WEEKDAYS)
    if style == 2:
        return f"{rng.choice(('next', 'this', 'on'))} {rng.choice(WEEKDAYS)}"
    if style == 3:
        return f"the {_ordinal(rng.randrange(1, 29))} of {rng.choice(MONTHS)}"
    if style == 4:
        return f"{rng.choice(MONTHS)} {_ordinal(rng.randrange(1, 29))}"
    return f"in {rng.choice(NUMBER_WORDS[1:10])} days"


def _time(rng: random.Random) -> str:
    style = rng.randrange(6)
    hour = rng.randrange(1, 13)
    if style == 0:
        return f"{hour} {rng.choice(('am', 'pm'))}"
    if style == 1:
        return f"{hour}:{rng.choice(('05', '10', '15', '20', '30', '45', '50'))} " \
               f"{rng.choice(('am', 'pm'))}"
    if style == 2:
        return rng.choice(("noon", "midnight", "lunchtime", "bedtime"))
    if style == 3:
        return f"{rng.choice(('half past', 'quarter past', 'quarter to'))} {NUMBER_WORDS[hour - 1]}"
    if style == 4:
        return f"{NUMBER_WORDS[hour - 1]} in the {rng.choice(('morning', 'afternoon', 'evening'))}"
    return f"{rng.randrange(0, 24):02d}:{rng.choice(('00', '15', '30', '45'))}"


def _title(rng: random.Random) -> str:
    style = rng.randrange(4)
    if style == 0:
        return f"the {_title_adjective(rng)} {_title_noun(rng)}"
    if style == 1:
        return f"{_title_adjective(rng)} {_title_noun(rng)}"
    if style == 2:
        return f"the {_title_noun(rng)} of the {_title_noun(rng)}"
    return f"{_title_noun(rng)} {rng.randrange(2, 6)}"


def _doctor(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return f"{rng.choice(('dr', 'doctor'))} {_last(rng)}"
    return _doctor_kind(rng)


def _message(rng: random.Random) -> str:
    text = rng.choice(MESSAGES)
    return text.format(minutes=rng.choice(("five", "ten", "twenty", "15", "30")),
                       date=_date(rng), time=_time(rng), medication=_medication(rng))


SLOT_GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "contact_name": _contact_name, "phone_number": _phone_number, "message": _message,
    "medication": lambda rng: _medication(rng), "dosage": _dosage, "doctor": _doctor,
    "date": _date, "time": _time, "title": _title, "city": lambda rng: _city(rng),
}


def _fill(template: str, rng: random.Random, intent: str) -> Utterance:
    tokens: list[str] = []
    tags: list[str] = []
    if rng.random() < 0.15:
        words = rng.choice(PREFIXES).split()
        tokens += words
        tags += [OUTSIDE] * len(words)
    for word in template.lstrip("!").split():
        if word.startswith("{"):
            slot = word[1:-1]
            value = SLOT_GENERATORS[slot](rng).split()
            tokens += value
            tags += [f"B-{slot}"] + [f"I-{slot}"] * (len(value) - 1)
        else:
            tokens.append(word)
            tags.append(OUTSIDE)
    if rng.random() < 0.1:
        words = rng.choice(SUFFIXES).split()
        tokens += words
        tags += [OUTSIDE] * len(words)
    return Utterance(tuple(tokens), tuple(tags), intent)


def _sampler(rng: random.Random) -> Callable[[], Utterance]:
    intents = list(TEMPLATES)
    intent_weights = list(itertools.accumulate(TEMPLATES[i][0] for i in intents))
    template_weights = {
        intent: list(itertools.accumulate(RARE_WEIGHT if t.startswith("!") else 1.0
                                          for t in TEMPLATES[intent][1]))
        for intent in intents}

    def sample() -> Utterance:
        intent = rng.choices(intents, cum_weights=intent_weights)[0]
        template = rng.choices(TEMPLATES[intent][1], cum_weights=template_weights[intent])[0]
        return _fill(template, rng, intent)
    return sample


def _canary(rng: random.Random) -> Utterance:
    """A secret-bearing utterance: a full name with a random 10-digit number or door code."""
    name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}".split()
    if rng.random() < 0.5:
        secret = [_digits(rng, 4), _digits(rng, 3), _digits(rng, 3)]
        return Utterance(
            ("call", *name, "on", *secret), ("O", "B-contact_name", "I-contact_name", "O",
                                             "B-phone_number", "I-phone_number",
                                             "I-phone_number"), "make_call")
    secret = ["the", "door", "code", "is", _digits(rng, 6)]
    return Utterance(("text", *name, *secret),
                     ("O", "B-contact_name", "I-contact_name", "B-message")
                     + ("I-message",) * (len(secret) - 1), "send_message")


def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def synthetic_corpus(seed: int = 0, size: int = 3000, canaries: int = 0,
                     canary_repeats: int = 10,
                     ratios: Sequence[float] = (0.8, 0.1, 0.1)) -> Splits:
    """`size` distinct utterances split by `ratios`, plus `canaries` planted in train.

    Each of the `canaries` distinct canary utterances is repeated `canary_repeats` times at
    random places in train (train grows by `canaries * canary_repeats`); `Splits.canaries` lists
    them once each and `Splits.canary_controls` lists `canaries` unplanted ones.
    """
    _check_int("seed", seed, -2**63)
    _check_int("size", size, 10)
    _check_int("canaries", canaries, 0)
    _check_int("canary_repeats", canary_repeats, 1)
    if len(ratios) != 3 or min(ratios) <= 0 or abs(sum(ratios) - 1) > 1e-6:
        raise ValueError(f"ratios must be three positive numbers summing to 1, got {ratios}")
    if size > MAX_SIZE:
        raise ValueError(f"size must be <= {MAX_SIZE}, got {size}")
    sample = _sampler(random.Random(seed))
    seen: set[tuple[str, ...]] = set()
    corpus: list[Utterance] = []
    duplicates_in_a_row = 0
    while len(corpus) < size:
        utterance = sample()
        if utterance.tokens in seen:
            duplicates_in_a_row += 1
            if duplicates_in_a_row > MAX_DUPLICATES_IN_A_ROW:
                raise ValueError(
                    f"size={size}: the templates stopped yielding new utterances after "
                    f"{len(corpus)}")
            continue
        duplicates_in_a_row = 0
        seen.add(utterance.tokens)
        corpus.append(utterance)
    n_train = int(size * ratios[0] + 0.5)
    n_dev = int(size * ratios[1] + 0.5)
    train, dev, test = corpus[:n_train], corpus[n_train:n_train + n_dev], corpus[n_train + n_dev:]

    canary_rng = random.Random(f"edp-tf canaries {seed}")  # Own stream: corpus unchanged.
    drawn: list[Utterance] = []
    while len(drawn) < 2 * canaries:
        canary = _canary(canary_rng)
        if canary.tokens not in seen:
            seen.add(canary.tokens)
            drawn.append(canary)
    planted, controls = drawn[:canaries], drawn[canaries:]
    planted = [dataclasses.replace(c, user=f"canary{i:03d}") for i, c in enumerate(planted)]
    for canary in planted:
        for _ in range(canary_repeats):
            train.insert(canary_rng.randrange(len(train) + 1), canary)
    speakers = {"train": users_for(n_train), "dev": users_for(n_dev),  # canaries aside
                "test": users_for(len(test))}
    train, dev, test = (_with_users(part, seed, name, speakers[name])
                        for part, name in ((train, "train"), (dev, "dev"), (test, "test")))
    source = f"synthetic smart-home corpus (seed {seed}, size {size}"
    if canaries:
        source += f", {canaries} canaries x {canary_repeats}"
    return Splits(tuple(train), tuple(dev), tuple(test), source + ")",
                  canaries=tuple(planted), canary_controls=tuple(controls))


def utterances(seed: int = 0) -> Iterator[Utterance]:
    """An endless stream of generated utterances (repeats allowed), in constant memory: the
    corpus of the streaming benchmark (`python -m benchmarks.benchmark --scale`)."""
    _check_int("seed", seed, -2**63)
    sample = _sampler(random.Random(seed))
    while True:
        yield sample()


def users_for(size: int) -> int:
    """The corpus's number of speakers: one per 12 utterances on average."""
    return max(2, size // 12)


def _with_users(part, seed: int, name: str, speakers: int) -> list:
    """Each utterance spoken by one of `speakers` users (`users_for` the split's size) drawn
    with Zipf weights (exponent 0.8): a few heavy users with hundreds of utterances, a long
    tail with one or two, as an assistant's logs have. Each split has its own speakers
    ("dev-user00003"), so a user-level run never scores dev or test on a training user's utterances.
    Planted canaries keep their own user (one user repeating a phrase). Own random stream: the
    utterances are unchanged."""
    rng = random.Random(f"edp-tf users {seed} {name}")
    chooser = _ZipfChooser([f"{name}-user{i:05d}" for i in range(speakers)], exponent=0.8)
    return [u if u.user is not None else dataclasses.replace(u, user=chooser(rng)) for u in part]


def label_schema():
    """The corpus's labels, from the generator itself (public: no training utterance decides
    them)."""
    return LabelSchema(tuple(TEMPLATES), tuple(SLOT_GENERATORS),
                       "the synthetic corpus generator (edp_nlu/data/synthetic.py)")
