#!/usr/bin/env python3
"""docs_links.py - every link of the docs leads somewhere.

Checks the Markdown of docs/*.md, README.md and CONTRIBUTING.md (or the
files given as arguments), outside fenced code blocks:

  * links and images, [text](target) and ![alt](target), that are not
    http(s) or mailto: the file or folder must exist (relative to the page),
    and a #fragment must be the anchor of a heading of the page it names
    (GitHub's rule: lower case, punctuation dropped, spaces to hyphens, a
    -1, -2 ... suffix for repeats);
  * references in prose to a section of a page, written
    `docs/PAGE.md, "Section"` or `docs/PAGE.md ("Section")` (also without
    `docs/` inside docs/): some heading of PAGE, or the bold lead of one of
    its paragraphs (**Section.**), must contain the quoted words.

Prints each broken link with its file and line, and exits 1 if there is
one; `-v` also lists what was checked.

    python3 tests/docs_links.py            # from the repository root
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
PROSE = re.compile(r'(?:docs/)?([a-z][a-z0-9-]*\.md)`?,?\s*\(?\s*"([^"]{3,})"')
FENCE = re.compile(r'^\s*(```|~~~)')


def text_lines(path):
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                out.append((n, line.rstrip('\n')))
    return out


def paragraphs(path):
    """(first line number, the paragraph's lines joined by spaces): a
    reference to a section may be broken across lines."""
    out, cur, last = [], None, None
    for n, line in text_lines(path):
        if not line.strip() or last is None or n != last + 1:
            if cur:
                out.append(cur)
            cur = [n, line.strip()] if line.strip() else None
        else:
            cur = [cur[0], cur[1] + ' ' + line.strip()] if cur else [n, line.strip()]
        last = n
    if cur:
        out.append(cur)
    return out


def slug(heading):
    """GitHub's anchor of a heading's text."""
    h = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)   # links: their text
    h = re.sub(r'<[^>]+>', '', h).strip().lower()
    h = ''.join(c for c in h if c.isalnum() or c in '-_ ')
    return h.replace(' ', '-')


_pages = {}


def page(path):
    """(anchors, lower-cased heading texts and bold paragraph leads) of a page."""
    if path not in _pages:
        anchors, titles, seen = set(), [], {}
        for _, line in text_lines(path):
            m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                anchors.add(base if k == 0 else '%s-%d' % (base, k))
                titles.append(m.group(2).replace('`', '').lower())
            for b in re.findall(r'\*\*([^*]+)\*\*', line):
                titles.append(b.replace('`', '').lower())
        _pages[path] = (anchors, titles)
    return _pages[path]


def check(path, verbose):
    errors = []
    where = os.path.relpath(path, ROOT)
    base = os.path.dirname(path)
    for n, line in text_lines(path):
        for m in LINK.finditer(line):
            target = m.group(1)
            if not target or re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):
                continue
            file_part, _, frag = target.partition('#')
            dest = os.path.normpath(os.path.join(base, file_part)) if file_part else path
            if verbose:
                print('%s:%d: %s' % (where, n, target))
            if not os.path.exists(dest):
                errors.append('%s:%d: %s: no such file' % (where, n, target))
                continue
            if frag:
                if not dest.endswith('.md') or os.path.isdir(dest):
                    errors.append('%s:%d: %s: an anchor in a file that is not a page' % (where, n, target))
                elif frag not in page(dest)[0]:
                    errors.append('%s:%d: %s: no heading with the anchor #%s in %s'
                                  % (where, n, target, frag, os.path.relpath(dest, ROOT)))
    for n, line in paragraphs(path):
        for m in PROSE.finditer(line):
            name, section = m.group(1), re.sub(r'\s+', ' ', m.group(2))
            dest = os.path.join(ROOT, 'docs', name)
            if not os.path.exists(dest):
                dest = os.path.join(ROOT, name)
            if not os.path.exists(dest):
                continue
            if verbose:
                print('%s:%d: %s "%s"' % (where, n, name, section))
            want = section.replace('`', '').lower().rstrip('.')
            if not any(want in t for t in page(dest)[1]):
                errors.append('%s:%d (paragraph): %s, "%s": no such section or paragraph in %s'
                              % (where, n, name, section, os.path.relpath(dest, ROOT)))
    return errors


def main():
    args = [a for a in sys.argv[1:] if a != '-v']
    verbose = '-v' in sys.argv[1:]
    if args:
        files = [os.path.abspath(a) for a in args]
    else:
        docs = os.path.join(ROOT, 'docs')
        files = sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
        files += [os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'CONTRIBUTING.md')]
    errors = []
    for f in files:
        errors += check(f, verbose)
    for e in errors:
        print(e)
    print('docs_links: %d file(s), %s' % (len(files), 'ok' if not errors else '%d broken' % len(errors)))
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
