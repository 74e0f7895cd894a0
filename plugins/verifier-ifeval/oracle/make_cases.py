"""Expected verdicts for tests/data/verifier_ifeval/oracle.jsonl from the reference implementation.

Runs IFEval's own Python checks (the copy vendored in lm-eval, `lm_eval/tasks/ifeval`) on a fixed
set of responses and instructions and writes, per item, the strict and loose result of every
instruction. The integration test `tests/tests/verifier_ifeval.rs` replays the file through the
plugin and asserts the same results.

Offline set-up (PyPI only; NLTK's punkt data is not downloadable here, so the English Punkt
tables this plugin ships are written out in NLTK's `punkt_tab` layout and NLTK's own
PunktTokenizer reads them):

    python3 -m venv /tmp/ifeval-oracle
    /tmp/ifeval-oracle/bin/pip install nltk==3.10.4 langdetect==1.0.9 immutabledict absl-py packaging
    /tmp/ifeval-oracle/bin/pip install --no-deps lm-eval==0.4.13
    /tmp/ifeval-oracle/bin/python plugins/verifier-ifeval/oracle/make_cases.py

langdetect is seeded (DetectorFactory.seed = 0): unseeded it is random.
"""

import json
import os
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import types

ROOT = pathlib.Path(__file__).resolve().parents[3]
PUNKT = ROOT / "plugins/verifier-ifeval/data/punkt_english"
OUT = ROOT / "tests/data/verifier_ifeval/oracle.jsonl"


def load_reference():
    """Imports lm-eval's ifeval modules without lm_eval/__init__ (which needs torch and more)."""
    nltk_data = pathlib.Path(tempfile.mkdtemp(prefix="ifeval-nltk-"))
    target = nltk_data / "tokenizers/punkt_tab/english"
    target.mkdir(parents=True)
    for name in ["abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt"]:
        shutil.copy(PUNKT / name, target / name)
    os.environ["NLTK_DATA"] = str(nltk_data)
    import nltk

    nltk.data.path.insert(0, str(nltk_data))
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    for name, path in [("lm_eval", site / "lm_eval"), ("lm_eval.tasks", site / "lm_eval/tasks")]:
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    from lm_eval.tasks.ifeval import instructions_util, utils

    # The reference loads `punkt/english.pickle`; NLTK >= 3.9 refuses pickles and ships the same
    # tables as `punkt_tab`, which is what `sent_tokenize` reads.
    instructions_util._get_sentence_tokenizer = lambda: nltk.tokenize.PunktTokenizer("english")
    import langdetect

    langdetect.DetectorFactory.seed = 0
    return utils


INSTRUCTIONS = [
    ("keywords:existence", {"keywords": ["python", "data"]}),
    ("keywords:existence", {"keywords": ["the"]}),
    ("keywords:frequency", {"keyword": "the", "frequency": 3, "relation": "at least"}),
    ("keywords:frequency", {"keyword": "data", "frequency": 2, "relation": "less than"}),
    ("keywords:forbidden_words", {"forbidden_words": ["very", "really"]}),
    ("keywords:forbidden_words", {"forbidden_words": ["a"]}),
    ("keywords:letter_frequency", {"letter": "e", "let_frequency": 10, "let_relation": "at least"}),
    ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 2, "let_relation": "less than"}),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}),
    ("length_constraints:number_sentences", {"num_sentences": 5, "relation": "less than"}),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}),
    ("length_constraints:number_words", {"num_words": 50, "relation": "at least"}),
    ("length_constraints:number_words", {"num_words": 20, "relation": "less than"}),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "second"}),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "the"}),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}),
    ("detectable_content:postscript", {"postscript_marker": "Note:"}),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}),
    ("detectable_format:constrained_response", {}),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2}),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 3}),
    ("detectable_format:json_format", {}),
    ("detectable_format:title", {}),
    ("combination:two_responses", {}),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a short note about cats."}),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"}),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}),
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"}),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"}),
    ("change_case:english_capital", {}),
    ("change_case:english_lowercase", {}),
    ("punctuation:no_comma", {}),
    ("startend:quotation", {}),
    ("language:response_language", {"language": "en"}),
]

LANGUAGE_INSTRUCTIONS = [
    ("language:response_language", {"language": code})
    for code in ["en", "es", "fr", "de", "ru", "hi", "ja", "ko", "pt", "it"]
] + [("change_case:english_capital", {}), ("change_case:english_lowercase", {})]

RESPONSES = [
    "Python is great for data work. The language is simple. The community is large. Data flows.",
    "python and DATA and Data and data again",
    "The the THE the.",
    "I really think this is very good, and a fine answer.",
    "",
    "   \n  ",
    "First paragraph here.\n\nSecond paragraph starts here.\n\nThird one.",
    "Intro line\nThe first paragraph.\n\nsecond, the paragraph.\n\n",
    "\n\nSecond. Leading blank paragraph.\n\n\"Second\" quoted start.",
    "para one\n***\npara two\n***\npara three",
    "***\npara one\n***\npara two\n***",
    "para one\n***\n\n***\npara three",
    "Dear [name], your order [order_id] ships to [address].",
    "Here is a note [x].\nP.S. call me.",
    "Main text.\np.s. lower case postscript",
    "Main text.\n\nP.P.S another one",
    "Main text. Note: remember this.",
    "* one\n* two\n* three",
    "- one\n- two\n  - nested\n*not a bullet*",
    "* one\n\n* two\n**bold line**",
    "My answer is yes.",
    "Well, My answer is maybe. I think.",
    "This has *one highlight* and *another* plus **bold part** and ** ** and *\n*.",
    "Section 1\nIntro\nSection 2\nBody\nSECTION 3\nEnd",
    "SECTION 1 a SECTION 2 b SECTION 3 c Section 4",
    '```json\n{"a": 1, "b": [1, 2, 3]}\n```',
    '{"a": NaN, "b": Infinity}',
    '```\n{"a": 1,}\n```',
    "<<A Poem of Joy>>\nRoses are red.",
    "<<  >> no title\n<<\nbroken>>",
    "First response here.\n******\nSecond response here.",
    "Same.\n******\nSame.",
    "One.\n******\n\n******\nThree.",
    "Write a short note about cats. Cats are independent animals.",
    "  write a SHORT note about cats.   Here it is.",
    "Thanks for asking. Is there anything else I can help with?",
    '"Done. Any other questions?"',
    "THIS IS ALL CAPS AND VERY LOUD, I DON'T CARE WHO HEARS IT.",
    "this is all lowercase english text without any capitals at all",
    "Mixed Case Text With NASA And FBI Acronyms.",
    '"Wrapped in quotes."',
    '"',
    "Mr. Smith went to Washington D.C. on Jan. 3 at 5 p.m. He met Dr. Jones. They talked... Then left!",
    "Numbers 3.14 and 2.71 are constants. Visit example.com today. U.S.A. is big. OK?",
    "(Parenthetical sentence.) Another one! \"Quoted sentence.\" Last one?",
    "Line without end punctuation\nanother line\n\nand a paragraph",
    "Title line\n* a\n* b\n* c\nClosing line",
    "Heading\n\"Wrapped body text.\"\nFooter",
    "intro line\n{\"key\": \"value\"}\ntrailing line",
    "I CAN'T STOP. WON'T STOP. GONNA WIN.",
    "HELLO-WORLD U.S.A. (NASA) 'QUOTED' \"DOUBLE\" CANNOT I'M",
    "Café naïve résumé — déjà vu; «quoted» “curly” ‘single’.",
    "Tabs\tand\u00a0non-breaking\u2003spaces, plus a comma.",
    "Ends with phrase\nAny other questions?\n",
    "Bullets:\n  * indented\n\t- tabbed\n*\tstar tab",
]

LANGUAGE_RESPONSES = [
    "The weather today is sunny and warm, and we are going to the park with our friends.",
    "El clima de hoy es soleado y cálido, y vamos al parque con nuestros amigos.",
    "Le temps aujourd'hui est ensoleillé et chaud, et nous allons au parc avec nos amis.",
    "Das Wetter heute ist sonnig und warm, und wir gehen mit unseren Freunden in den Park.",
    "Погода сегодня солнечная и тёплая, и мы идём в парк с нашими друзьями.",
    "आज मौसम धूप वाला और गर्म है, और हम अपने दोस्तों के साथ पार्क जा रहे हैं।",
    "今日の天気は晴れて暖かいので、友達と一緒に公園に行きます。",
    "오늘 날씨는 맑고 따뜻해서 친구들과 함께 공원에 갑니다.",
    "O tempo hoje está ensolarado e quente, e vamos ao parque com nossos amigos.",
    "Il tempo oggi è soleggiato e caldo, e andiamo al parco con i nostri amici.",
    "THE WEATHER TODAY IS SUNNY AND WARM, AND WE ARE GOING TO THE PARK WITH OUR FRIENDS.",
    "the weather today is sunny and warm, and we are going to the park with our friends.",
    "12345 67890",
]


def main():
    utils = load_reference()
    cases = []
    for group, responses, instructions in [
        ("r", RESPONSES, INSTRUCTIONS),
        ("lang", LANGUAGE_RESPONSES, LANGUAGE_INSTRUCTIONS),
    ]:
        for index, response in enumerate(responses):
            ids = [instruction_id for instruction_id, _ in instructions]
            kwargs = [dict(args) for _, args in instructions]
            example = utils.InputExample(
                key=index, instruction_id_list=ids, prompt="Write a short note about cats.", kwargs=kwargs
            )
            strict = utils.test_instruction_following_strict(example, response).follow_instruction_list
            loose = utils.test_instruction_following_loose(example, response).follow_instruction_list
            cases.append(
                {
                    "id": f"{group}-{index}",
                    "completion": response,
                    "reference": {"instruction_id_list": ids, "kwargs": kwargs},
                    "strict": strict,
                    "loose": loose,
                }
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as out:
        for case in cases:
            out.write(json.dumps(case, ensure_ascii=False) + "\n")
    checks = sum(len(case["strict"]) for case in cases)
    print(f"wrote {len(cases)} items, {checks} instruction checks per mode, to {OUT}")


if __name__ == "__main__":
    main()
