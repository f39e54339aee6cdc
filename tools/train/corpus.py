"""The training text: the King James Version of the Bible (public domain),
as Debian's bible-kjv-text package ships it, read through the package's own
`bible` program (bible-kjv). One document per chapter (1189 of them), the
chapter's title on the first line, then one verse per line without its
number. The held-out set is every 20th chapter (index % 20 == 10 in book
order), so it samples every part of the book and never shares a chapter with
training.
"""

import re
import shutil
import subprocess

HELDOUT_EVERY, HELDOUT_AT = 20, 10
APT_HINT = "apt-get install bible-kjv bible-kjv-text"

_TITLE = re.compile(r"^(\S.*) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def kjv_chapters():
    """[(title, text)] for all 1189 chapters, in book order."""
    exe = shutil.which("bible")
    if not exe:
        raise SystemExit("error: the KJV text comes from Debian's bible-kjv package: " + APT_HINT)
    # -l with a huge width: one line per verse, no wrapping.
    out = subprocess.run([exe, "-l1000000", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, check=True).stdout.decode("utf-8")
    chapters, title, verses = [], None, []
    for line in out.split("\n"):
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if m:
            if title is None:
                raise SystemExit("error: unexpected output of 'bible': %r" % line[:80])
            verses.append(m.group(2).strip())
            continue
        m = _TITLE.match(line)
        if not m:
            raise SystemExit("error: unexpected output of 'bible': %r" % line[:80])
        if title is not None:
            chapters.append((title, verses))
        title, verses = line.strip(), []
    if title is not None:
        chapters.append((title, verses))
    if len(chapters) != 1189 or sum(len(v) for _, v in chapters) != 31102:
        raise SystemExit("error: expected 1189 chapters and 31102 verses from 'bible', got %d and %d"
                         % (len(chapters), sum(len(v) for _, v in chapters)))
    return [(t, t + "\n\n" + "\n".join(v) + "\n") for t, v in chapters]


def split(chapters):
    """(train, heldout) lists of document texts."""
    train, heldout = [], []
    for i, (_, text) in enumerate(chapters):
        (heldout if i % HELDOUT_EVERY == HELDOUT_AT else train).append(text)
    return train, heldout
