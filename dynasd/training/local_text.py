"""Task prompts over text that ships with the machine: long English passages to summarise or read from, and short
German, French and Spanish sentences to translate into English.

Why: the feature draft agreed least with the target where the answer works on a text in the prompt (Spec-Bench
answers: summarization 0.14, translation 0.17, rag 0.25 at depth 1, against 0.47 on questions), and its training
text had no long passages (the target's own answers, <= 160 tokens) and no German at all. No outside text may be
fetched, so the passages come from what every Python and most Debian systems carry: the Python language
reference (`pydoc_data.topics`), the standard library's module docstrings, the licence texts under
/usr/share/common-licenses, and the translated messages of the gettext catalogs under /usr/share/locale. The
prompts only borrow the benchmark's task *forms* ("Summarize: ...", "Translate German to English: ..."), never its
text. Which catalogs a machine has varies: the written shards keep the token ids, so nothing has to be found again.
"""
from __future__ import annotations

import ast
import gettext
import pydoc_data.topics as topics
import random
import re
import sys
from pathlib import Path

SUMMARY_TEMPLATES = (
    "Summarize: {passage}",
    "Summarize the following text in a few sentences.\n\n{passage}",
    "Write a short summary of this article:\n\n{passage}",
)
READING_TEMPLATES = (
    "{passage}\n\nBased on the text above, what is its main point?",
    "{passage}\n\nList the three most important facts in the text above.",
    "Read the following text and explain it to a beginner.\n\n{passage}",
    "{passage}\n\nAccording to the text, what should a reader remember? Answer briefly.",
    "Extract every technical term defined in this text, with a short definition of each:\n\n{passage}",
)
LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish"}
TRANSLATION_TEMPLATE = "Translate {language} to English: {sentence}"
FORMAT_MARK = re.compile(r"%|\{|\}|<[a-z/]|\\|_[a-zA-Z]|https?:|@|\t")


def english_passages(min_words: int = 150, max_words: int = 450) -> list[str]:
    """Prose passages of `min_words`..`max_words`: paragraphs of the language reference, module docstrings and
    licences, joined in order until long enough (code blocks, indented, are left out)."""
    passages: list[str] = []
    for text in _english_documents():
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text)]
        chunk: list[str] = []
        for para in paragraphs:
            if not para or para.startswith((" ", ">>>", "*", "=", "-")) or len(para.split()) < 12:
                continue
            chunk.append(" ".join(para.split()))
            words = sum(len(c.split()) for c in chunk)
            if words >= min_words:
                if words <= max_words:
                    passages.append("\n\n".join(chunk))
                chunk = []
    return passages


def _english_documents() -> list[str]:
    documents = [topics.topics[name] for name in sorted(topics.topics)]
    stdlib = Path(sys.modules["os"].__file__).parent
    for path in sorted(stdlib.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and len(doc) > 600:
            documents.append(doc)
    licences = Path("/usr/share/common-licenses")
    documents += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(licences.glob("*"))
                  if p.is_file() and not p.is_symlink()] if licences.is_dir() else []
    return documents


def foreign_sentences(locale_dir: Path = Path("/usr/share/locale"), min_words: int = 6, max_words: int = 40
                      ) -> list[tuple[str, str]]:
    """(language, sentence) for every translated message of `LANGUAGES` in the gettext catalogs under `locale_dir`
    that reads as a sentence: `min_words`..`max_words` words on one line, no format placeholders, markup or
    addresses; each sentence once."""
    found: list[tuple[str, str]] = []
    for code, language in LANGUAGES.items():
        seen: set[str] = set()
        for path in sorted((locale_dir / code / "LC_MESSAGES").glob("*.mo")):
            try:
                with path.open("rb") as handle:
                    catalog = gettext.GNUTranslations(handle)._catalog  # msgid -> msgstr
            except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
                continue
            for msgid, text in catalog.items():
                if not msgid or not isinstance(text, str) or "\n" in text.strip() or FORMAT_MARK.search(text):
                    continue
                sentence = " ".join(text.split())
                if min_words <= len(sentence.split()) <= max_words and sentence not in seen:
                    seen.add(sentence)
                    found.append((language, sentence))
    return found


def local_task_texts(count: int, seed: int, passages: list[str], sentences: list[tuple[str, str]]) -> list[str]:
    """`count` user messages, a third each summaries, readings of a passage and translations (passage tasks in
    their place where no sentences were found); seeded, so the same seed and sources give the same messages."""
    pick = random.Random(seed)
    texts = []
    for i in range(count):
        kind = i % 3
        if kind == 2 and sentences:
            language, sentence = pick.choice(sentences)
            texts.append(TRANSLATION_TEMPLATE.format(language=language, sentence=sentence))
        elif passages:
            templates = SUMMARY_TEMPLATES if kind == 0 else READING_TEMPLATES
            texts.append(pick.choice(templates).format(passage=pick.choice(passages)))
    return texts
