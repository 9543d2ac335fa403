"""The headings of a Markdown file (outside code fences), with their line and level."""
import re,sys
def sections(path):
    lines=open(path).read().split('\n')
    heads=[]; fence=False
    for i,l in enumerate(lines):
        if l.startswith('```'): fence=not fence
        if not fence and re.match(r'^#{1,4} ',l): heads.append((i,len(l)-len(l.lstrip('#')),l.lstrip('# ').strip()))
    return lines,heads
if __name__=='__main__':
    for p in sys.argv[1:]:
        lines,heads=sections(p)
        for i,(n,lvl,t) in enumerate(heads):
            print(p,n+1,lvl,t)
