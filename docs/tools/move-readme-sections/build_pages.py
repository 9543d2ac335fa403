"""Moves the READMEs' sections into the guide's pages (issue 32), as plan.py lists them.

One-shot for the wave's README trim: the pages were made with it from the READMEs at e6b7ea2.
After the wave's other branches are merged (they edit README sections too), run it again to
refresh the moved pages from the READMEs as they are then (it overwrites only the pages
plan.py names, and stops if one of plan.py's FIXES no longer applies), check the diff, trim
the READMEs to links into the guide, and delete this folder with them.

    python3 docs/tools/move-readme-sections/build_pages.py   # prints links it made into code
"""
import re, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sections import sections
ROOT = os.path.normpath(os.path.join(HERE, '..', '..', '..'))
SRC = os.path.join(ROOT, 'docs/src')

def gh_id(text):
    t = text.strip().lower()
    t = re.sub(r'[^\w\- ]', '', t)
    return t.replace(' ', '-')

# (file, heading text) -> (start, end) line idx, level; end = next heading of level <= level
def section_range(path, title, exclude=()):
    lines, heads = sections(os.path.join(ROOT, path))
    for k, (n, lvl, t) in enumerate(heads):
        if t == title:
            end = len(lines)
            for n2, l2, t2 in heads[k+1:]:
                if l2 <= lvl:
                    end = n2; break
            # exclusions: subsections cut out
            keep = []
            cut = []
            for ex in exclude:
                for k2, (m, l3, t3) in enumerate(heads):
                    if t3 == ex and n < m < end:
                        e2 = end
                        for m2, l4, t4 in heads[k2+1:]:
                            if l4 <= l3:
                                e2 = m2; break
                        cut.append((m, min(e2, end)))
            body = [i for i in range(n, end) if not any(a <= i < b for a, b in cut)]
            return lines, body, lvl, [(m, l, t) for (m, l, t) in heads if n <= m < end and not any(a <= m < b for a, b in cut)]
    raise SystemExit(f'no section {title!r} in {path}')

PAGES = {}   # page -> (title, lead, [(file, title, exclude, drop_heading)])
def page(p, title, lead, parts):
    PAGES[p] = (title, lead, parts)

R, H, A, O, C = 'README.md', 'hub/README.md', 'agent/README.md', 'operator/README.md', 'manifests/helm/scale-agent/README.md'
exec(open(os.path.join(HERE, 'plan.py')).read())

# where each moved heading lands: (file, id) -> page
where = {}
for p, (title, lead, parts) in PAGES.items():
    for part in parts:
        f, t = part[0], part[1]
        if f is None or t is None: continue
        _, _, _, hs = section_range(f, t, part[2] if len(part) > 2 else ())
        for m, l, tt in hs:
            where.setdefault((f, gh_id(tt)), p)
    # whole-file fallbacks
FILE_PAGE = {R: 'introduction.md', H: 'concepts/hub.md', A: 'concepts/agents.md', O: 'reference/operator.md',
             'docs/crds.md': 'reference/crds.md', 'docs/monitoring.md': 'operations/monitoring.md',
             'bench/README.md': None, 'proto/proto/scaleagent/v1/agent.proto': 'reference/wire-protocol.md', 'e2e/README.md': None}

def relpage(frm, to):
    return os.path.relpath(os.path.join(SRC, to), os.path.dirname(os.path.join(SRC, frm)))

unresolved = []
HTML_TAGS = {'br', 'sub', 'sup', 'details', 'summary', 'code', 'kbd', 'b', 'i', 'em', 'strong'}
def escape_placeholders(text):
    # `<id>` outside code is an HTML tag to Markdown (GitHub drops it, mdBook warns): escape it
    out, fence = [], False
    for line in text.split('\n'):
        if line.startswith('```'):
            fence = not fence
        if not fence:
            parts = line.split('`')
            for k in range(0, len(parts), 2):
                parts[k] = re.sub(r'<([A-Za-z][\w|.:/ -]*)>',
                    lambda m: m.group(0) if m.group(1).lower() in HTML_TAGS else f'&lt;{m.group(1)}&gt;', parts[k])
            line = '`'.join(parts)
        out.append(line)
    return '\n'.join(out)
def rewrite_links(text, srcfile, page_path):
    def repl(m):
        label, target = m.group(1), m.group(2)
        if re.match(r'^[a-z]+:', target):
            return m.group(0)
        path, _, frag = target.partition('#')
        if path == '':
            f = srcfile
        else:
            f = os.path.normpath(os.path.join(os.path.dirname(srcfile), path))
        if frag and (f, frag) in where:
            to = where[(f, frag)]
            if to == page_path:
                return f'[{label}](#{frag})'
            if label in ('below', 'above'):
                label = PAGES[to][0]
            return f'[{label}]({relpage(page_path, to)}#{frag})'
        if not frag and f in FILE_PAGE and FILE_PAGE[f]:
            return f'[{label}]({relpage(page_path, FILE_PAGE[f])})'
        unresolved.append((page_path, srcfile, target))
        # a file of the repository outside the book: say its path
        shown = f + (('#' + frag) if frag else '')
        if label.strip('`') == shown or label.strip('`') == f:
            return f'`{shown}`'
        return f'{label} (`{shown}`)'
    return re.sub(r'(?<!!)\[([^\]]+)\]\(([^)\s]+)\)', repl, text)

for p, (title, lead, parts) in PAGES.items():
    out = [f'# {title}', '']
    if lead:
        out += [lead.strip(), '']
    for part in parts:
        f, t = part[0], part[1]
        if f is None:
            out += [f'<!-- written for the guide: docs/src/{p} (issue 32) -->', '', t.strip(), '']
            continue
        excl = part[2] if len(part) > 2 else ()
        drop = part[3] if len(part) > 3 else False
        if t is None:
            lines = open(os.path.join(ROOT, f)).read().split('\n')
            a, b = excl
            body, lvl, excl = list(range(a - 1, b)), 1, ()
            t = f'lines {a}-{b}'
        else:
            lines, body, lvl, hs = section_range(f, t, excl)
        out.append(f'<!-- moved from {f} "{t}" (issue 32) -->')
        out.append('')
        fence = False
        for i in body:
            l = lines[i]
            if l.startswith('```'): fence = not fence
            if not fence and re.match(r'^#{1,6} ', l):
                n = len(l) - len(l.lstrip('#'))
                if i == body[0] and drop:
                    continue
                l = '#' * (n - lvl + 2) + l[n:]
            out.append(l)
        while out and out[-1] == '': out.pop()
        out.append('')
    text = '\n'.join(out)
    # rewrite links per source part: done on whole text with the part's file as base
    chunks = re.split(r'(<!-- (?:moved from|written for the guide:) \S+ )', text)
    res = chunks[0]
    for k in range(1, len(chunks), 2):
        srcfile = chunks[k].split()[-1]
        if srcfile.startswith('docs/src/'):
            res += chunks[k] + chunks[k+1]
        else:
            res += chunks[k] + rewrite_links(chunks[k+1], srcfile, p)
    res = escape_placeholders(res)
    for old, new in FIXES.get(p, []):
        if old not in res:
            raise SystemExit(f'fix for {p} did not apply: {old[:60]!r}')
        res = res.replace(old, new)
    os.makedirs(os.path.dirname(os.path.join(SRC, p)), exist_ok=True)
    open(os.path.join(SRC, p), 'w').write(res.rstrip('\n') + '\n')

for u in sorted(set(unresolved)):
    print('unresolved', *u)
