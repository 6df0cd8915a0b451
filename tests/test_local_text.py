"""Task prompts over text found on the machine: which catalog messages count as sentences to translate, how long
the English passages are, and that a local text stage writes its own seeded shards beside the others."""
import json
import struct

from dynasd.cli import main
from dynasd.training.local_text import TRANSLATION_TEMPLATE, english_passages, foreign_sentences, local_task_texts
from dynasd.training.token_store import load_token_shards, token_shards


def write_mo(path, messages: dict[str, str]) -> None:
    """A GNU gettext catalog (.mo) of `messages`, as msgfmt writes it: header, sorted ids, then their strings."""
    ids = sorted(messages)
    keys, values = [m.encode() for m in ids], [messages[m].encode() for m in ids]
    table_start = 7 * 4
    data_start = table_start + 16 * len(ids)
    blob, key_table, value_table = b"", [], []
    for encoded in keys:
        key_table.append((len(encoded), data_start + len(blob)))
        blob += encoded + b"\0"
    for encoded in values:
        value_table.append((len(encoded), data_start + len(blob)))
        blob += encoded + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(ids), table_start, table_start + 8 * len(ids), 0, 0)
    tables = b"".join(struct.pack("<2I", *entry) for entry in key_table + value_table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables + blob)


def test_only_plain_one_line_sentences_of_a_catalog_are_kept_once_each(tmp_path):
    german = {
        "": "Content-Type: text/plain; charset=UTF-8\n",
        "The printer is not connected or switched off.":
            "Der Drucker ist nicht angeschlossen oder ausgeschaltet worden.",
        "The same printer message again, from another id.":
            "Der Drucker ist nicht angeschlossen oder ausgeschaltet worden.",
        "Cannot open %s for reading because it is missing": "Kann %s nicht zum Lesen öffnen, da es fehlt",
        "Open file": "Datei öffnen",
        "Two lines of help text are shown here for the user.": "Zwei Zeilen\nHilfetext werden hier angezeigt.",
        "See https://example.org for all the details and more": "Siehe https://example.org für alle Details",
    }
    write_mo(tmp_path / "de" / "LC_MESSAGES" / "demo.mo", german)
    write_mo(tmp_path / "fr" / "LC_MESSAGES" / "demo.mo",
             {"": german[""],
              "Save the document before closing the window.": "Enregistrez le document avant de fermer la fenêtre."})
    (tmp_path / "es" / "LC_MESSAGES").mkdir(parents=True)
    (tmp_path / "es" / "LC_MESSAGES" / "broken.mo").write_bytes(b"not a catalog")
    assert foreign_sentences(tmp_path) == [
        ("German", "Der Drucker ist nicht angeschlossen oder ausgeschaltet worden."),
        ("French", "Enregistrez le document avant de fermer la fenêtre.")]


def test_english_passages_are_prose_of_the_asked_length():
    passages = english_passages(min_words=150, max_words=450)
    assert len(passages) > 100  # the language reference alone gives hundreds
    assert all(150 <= len(p.split()) <= 450 for p in passages)
    assert not any(p.lstrip().startswith(">>>") for p in passages)


def test_task_texts_are_seeded_and_a_third_each_summary_reading_translation():
    passages = [f"passage {i} " + "word " * 200 for i in range(5)]
    sentences = [("German", f"Satz Nummer {i} ist hier zu lesen.") for i in range(5)]
    texts = local_task_texts(9, 3, passages, sentences)
    assert texts == local_task_texts(9, 3, passages, sentences)
    assert texts != local_task_texts(9, 4, passages, sentences)
    translations = [t for t in texts if t.startswith(TRANSLATION_TEMPLATE.split("{")[0])]
    assert [texts.index(t) % 3 for t in translations] == [2, 2, 2]
    assert all("Translate German to English: Satz Nummer" in t for t in translations)
    assert all("passage" in t for t in texts if t not in translations)
    alone = local_task_texts(6, 0, passages, [])  # no sentences found: passage tasks in their place
    assert len(alone) == 6 and not any(t.startswith("Translate") for t in alone)


def test_a_local_text_stage_writes_its_own_shards_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr("dynasd.training.draft_text.foreign_sentences",
                        lambda: [("German", "Das ist ein kurzer Satz zum Übersetzen.")])
    text, out = tmp_path / "text", tmp_path / "work"
    args = ["train-feature-draft", "--pair", "tiny-random", "--text", str(text), "--out", str(out), "--threads",
            "1", "--stage", "text", "--text-source", "local", "--text-shards", "2", "--shard-prompts", "3",
            "--text-max-new-tokens", "8", "--text-batch", "3"]
    assert main(args) == 0
    assert [p.name for p in token_shards(text)] == ["train-local-0000.npz", "train-local-0001.npz"]
    seqs = load_token_shards(token_shards(text))
    assert len(seqs) == 6 and all(len(s.ids) > s.answer_start for s in seqs)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert log[0]["source"] == "local" and log[0]["sentences"] == 1
    before = {p.name: p.read_bytes() for p in token_shards(text)}
    assert main(args) == 0  # every shard there: none written again
    assert {p.name: p.read_bytes() for p in token_shards(text)} == before
