# Prints the median tables of README.md: python3 summarize.py round-d
import json,glob,statistics,sys
rnd=sys.argv[1]
def load(kind):
    d={}
    for f in sorted(glob.glob(f'{rnd}/{kind}-*.json')):
        for r in json.load(open(f)):
            d.setdefault((r['payload_bytes'],r['system']),[]).append(r)
    return d
t=load('thr'); l=load('lat')
print(f'### {rnd}: throughput medians (msg/s) over {len(glob.glob(rnd+"/thr-*.json"))} runs')
print('| payload | protocol | before | after | after/before |'); print('|---|---|---|---|---|')
for (p,s) in sorted(t):
    if s.endswith('-before'):
        base=s[:-7]; a=t.get((p,base+'-after'))
        if not a: continue
        b=statistics.median(r['msgs_per_sec'] for r in t[(p,s)]); aa=statistics.median(r['msgs_per_sec'] for r in a)
        print(f'| {p} | {base} | {b:,.0f} | {aa:,.0f} | {aa/b:.2f} |')
for (p,s) in sorted(t):
    if s=='nats': print(f'| {p} | nats-server | {statistics.median(r["msgs_per_sec"] for r in t[(p,s)]):,.0f} | | |')
print(f'\n### {rnd}: latency p50 medians (us)')
print('| payload | protocol | before p50 | after p50 | after/before | before p99 | after p99 |'); print('|---|---|---|---|---|---|---|')
for (p,s) in sorted(l):
    if s.endswith('-before'):
        base=s[:-7]; a=l.get((p,base+'-after'))
        if not a: continue
        m=lambda rs,k: statistics.median(r[k] for r in rs if r[k] is not None)
        print(f'| {p} | {base} | {m(l[(p,s)],"p50_us"):.1f} | {m(a,"p50_us"):.1f} | {m(a,"p50_us")/m(l[(p,s)],"p50_us"):.2f} | {m(l[(p,s)],"p99_us"):.1f} | {m(a,"p99_us"):.1f} |')
