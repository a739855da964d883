"""Document QA: questions about figures in a corpus of synthetic annual reports, answered with a citation.

The corpus is generated, not copied: company names, figures and sentences come from a fixed random.Random, so
every run writes the same reports. Each question's hidden part holds the answer (number with its scale) and the
exact sentence that states it, which occurs verbatim in the report the sandbox mounts under docs/.
"""

import random
from dataclasses import dataclass, field

from .draft import Draft

SEED = 20240517
REPORTS = 30
COMPARISONS = 40

NAMES = ["Northwind", "Bluefin", "Copperleaf", "Halcyon", "Ironbark", "Juniper", "Kestrel", "Lumen", "Meridian",
         "Nimbus", "Orchard", "Pinecrest", "Quarrystone", "Redwater", "Saltmarsh", "Tidewell", "Umberfield",
         "Vantage", "Willowby", "Yarrow", "Zephyr", "Alderbrook", "Brightwater", "Cobalt", "Driftwood", "Emberly",
         "Foxglove", "Granite Peak", "Heronsgate", "Ivorydale"]
SECTORS = [("Logistics", "freight forwarding and warehousing"), ("Robotics", "autonomous warehouse robots"),
           ("Foods", "packaged foods for supermarkets"), ("Software", "accounting software for small firms"),
           ("Energy", "rooftop solar installations"), ("Health", "outpatient clinics"),
           ("Textiles", "technical fabrics for outdoor gear"), ("Analytics", "footfall analytics for retailers"),
           ("Materials", "recycled building materials"), ("Marine", "harbour towage services")]
CITIES = ["Porto", "Leeds", "Tampere", "Ghent", "Graz", "Bilbao", "Malmo", "Utrecht", "Cork", "Brno", "Turin",
          "Aarhus", "Lyon", "Krakow", "Bergen"]

PROMPT = (
    "The reports are in the sandbox: {documents}.\n\n"
    "Question: {question}\n\n"
    "Give the number with its unit and scale (for example 12.4 million, 15%), and quote the exact sentence of "
    "the report that states it. Reply with JSON: "
    '{{"answer": "12.4 million", "citations": [{{"doc_id": "report-001", "quote": "the exact sentence"}}]}}'
)


@dataclass
class Report:
    doc_id: str
    company: str
    year: int
    sentences: list[str] = field(default_factory=list)
    facts: list[dict] = field(default_factory=list)  # {fact, question, answer, unit, value, span}
    headcount: int = 0
    headcount_span: str = ""

    @property
    def path(self) -> str:
        return f"docs/{self.doc_id}.txt"

    @property
    def text(self) -> str:
        return "\n\n".join(self.sentences) + "\n"

    def state(self, sentence: str) -> str:
        self.sentences.append(sentence)
        return sentence

    def ask(self, fact: str, question: str, answer: str, unit: str, value: float, span: str) -> None:
        self.facts.append({"fact": fact, "question": question, "answer": answer, "unit": unit, "value": value,
                           "span": span})


def _money(millions: float) -> str:
    return f"{millions:.1f} million"


def _report(rng: random.Random, number: int, name: str) -> Report:
    sector, activity = rng.choice(SECTORS)
    company, year = f"{name} {sector}", rng.randint(2021, 2024)
    owner = f"{company}'" if company.endswith("s") else f"{company}'s"  # Northwind Foods' revenue
    r = Report(doc_id=f"report-{number:03d}", company=company, year=year)
    r.state(f"{company.upper()} - ANNUAL REPORT, FISCAL {year}")
    r.state(f"{company} provides {activity} from its headquarters in {rng.choice(CITIES)}.")

    revenue = round(rng.uniform(4, 900), 1)
    while True:
        prior = round(revenue / (1 + rng.randint(-12, 35) / 100), 1)
        growth = round((revenue - prior) / prior * 100)  # stated from the rounded figures, so it checks out
        if growth != 0:
            break
    direction = "up" if growth > 0 else "down"
    span = r.state(f"Revenue for fiscal {year} was ${_money(revenue)}, {direction} {abs(growth)}% from "
                   f"${_money(prior)} in fiscal {year - 1}.")
    r.ask("revenue", f"What was {owner} revenue in fiscal {year}?", _money(revenue), "USD",
          revenue * 1e6, span)
    r.ask("prior-revenue", f"What revenue did {company} report for fiscal {year - 1}?", _money(prior), "USD",
          prior * 1e6, span)
    verb = "grow" if growth > 0 else "fall"
    r.ask("revenue-growth", f"By what percentage did {owner} revenue {verb} from fiscal {year - 1} to fiscal "
          f"{year}?", f"{abs(growth)}%", "percent", abs(growth), span)

    q4 = round(revenue * rng.uniform(0.22, 0.31), 1)
    span = r.state(f"Fourth-quarter revenue was ${_money(q4)}.")
    r.ask("q4-revenue", f"What was {owner} fourth-quarter revenue in fiscal {year}?", _money(q4), "USD",
          q4 * 1e6, span)

    margin = round(rng.uniform(-6, 24), 1)
    span = r.state(f"Operating margin was {margin}% for the year.")
    r.ask("operating-margin", f"What was {owner} operating margin in fiscal {year}?", f"{margin}%", "percent",
          margin, span)

    net = round(revenue * rng.uniform(-0.08, 0.18), 1) or 0.1
    if net > 0:
        span = r.state(f"Net income was ${_money(net)}.")
        r.ask("net-income", f"What net income did {company} report for fiscal {year}?", _money(net), "USD",
              net * 1e6, span)
    else:
        span = r.state(f"The company recorded a net loss of ${_money(-net)}.")
        r.ask("net-loss", f"How large was {owner} net loss in fiscal {year}?", _money(-net), "USD",
              -net * 1e6, span)

    research = round(revenue * rng.uniform(0.02, 0.25), 1) or 0.1
    span = r.state(f"Research and development spending was ${_money(research)}.")
    r.ask("research-spend", f"How much did {company} spend on research and development in fiscal {year}?",
          _money(research), "USD", research * 1e6, span)

    r.headcount, offices = rng.randint(40, 9000), rng.randint(1, 24)
    r.headcount_span = span = r.state(
        f"At the end of fiscal {year} the company employed {r.headcount:,} people across {offices} "
        f"office{'s' if offices > 1 else ''}.")
    r.ask("headcount", f"How many people did {company} employ at the end of fiscal {year}?", str(r.headcount),
          "people", r.headcount, span)
    r.ask("offices", f"In how many offices did {company} have staff at the end of fiscal {year}?", str(offices),
          "offices", offices, span)

    customers, share = rng.randint(120, 48000), rng.randint(3, 40)
    span = r.state(f"{company} served {customers:,} customers during the year; its largest customer accounted "
                   f"for {share}% of revenue.")
    r.ask("customers", f"How many customers did {company} serve in fiscal {year}?", str(customers), "customers",
          customers, span)
    r.ask("largest-customer-share", f"What share of {owner} fiscal {year} revenue came from its largest "
          "customer?", f"{share}%", "percent", share, span)

    if net > 0 and rng.random() < 0.6:
        dividend = rng.randint(5, 180) / 100
        span = r.state(f"The board declared a dividend of ${dividend:.2f} per share.")
        r.ask("dividend", f"What dividend per share did {company} declare for fiscal {year}?", f"{dividend:.2f}",
              "USD per share", dividend, span)
    else:
        r.state("The board did not declare a dividend.")

    low = rng.randint(0, 15)
    r.state(f"Management expects revenue growth of {low}% to {low + rng.randint(2, 6)}% in fiscal {year + 1}.")
    return r


def corpus() -> list[Report]:
    rng = random.Random(SEED)
    return [_report(rng, number, name) for number, name in enumerate(NAMES[:REPORTS], start=1)]


def corpus_files(reports: list[Report]) -> dict[str, str]:
    """What the docqa-corpus image mounts: one text file per report, plus an index."""
    index = "".join(f"{r.doc_id}\t{r.company}\tfiscal {r.year}\n" for r in reports)
    return {"docs/INDEX.tsv": index, **{r.path: r.text for r in reports}}


def _instance(key: str, question: str, reports: list[Report], answer: str, unit: str, value: float,
              spans: list[str]) -> dict:
    return {
        "key": key,
        "inputs": {"question": question, "doc_ids": [r.doc_id for r in reports],
                   "documents": ", ".join(r.path for r in reports)},
        "hidden": {"answer": answer, "unit": unit, "value": value,
                   "citations": [{"doc_id": r.doc_id, "span": s} for r, s in zip(reports, spans, strict=True)]},
    }


def instances(reports: list[Report]) -> list[dict]:
    items = [_instance(f"{r.doc_id}-{f['fact']}", f["question"], [r], f["answer"], f["unit"], f["value"],
                       [f["span"]])
             for r in reports for f in r.facts]
    # Cross-document questions: two reports, two spans to cite, an answer neither report states.
    rng = random.Random(SEED + 1)
    pairs = sorted({tuple(sorted(rng.sample(range(len(reports)), 2))) for _ in range(COMPARISONS * 2)})
    for i, j in pairs[:COMPARISONS]:
        big, small = sorted([reports[i], reports[j]], key=lambda r: r.headcount, reverse=True)
        if big.headcount == small.headcount:
            continue
        difference = big.headcount - small.headcount
        question = (f"How many more people did {big.company} employ at the end of fiscal {big.year} than "
                    f"{small.company} at the end of fiscal {small.year}?")
        items.append(_instance(f"compare-headcount-{big.doc_id}-{small.doc_id}", question, [big, small],
                               str(difference), "people", difference,
                               [big.headcount_span, small.headcount_span]))
    return items


def drafts() -> list[Draft]:
    reports = corpus()
    template = {
        "system_prompt": "You answer questions about company reports. Every number you give must be quoted "
                         "from a report, sentence and all.",
        "prompt_template": PROMPT,
        "tools": [
            {"name": "read_document", "description": "Return the full text of one report.",
             "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}},
                            "required": ["doc_id"]}},
            {"name": "search_documents", "description": "Find sentences containing the query, with their report.",
             "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                            "required": ["query"]}},
        ],
        "sandbox_image": "docqa-corpus",
        "verifier": "cited-numbers",
        "limits": {"max_turns": 8, "max_tokens": 2048, "max_seconds": 120},
    }
    return [
        Draft("task_template", "cite-figures", "Read a figure from one or two annual reports and cite the "
              "sentence that states it.", template, instances(reports)),
        Draft("domain", "document-qa", "Numbers from documents, each traceable to a cited sentence.",
              {"sampling_weight": 1.5, "templates": [{"template": "cite-figures", "weight": 1.0}]}),
    ]
