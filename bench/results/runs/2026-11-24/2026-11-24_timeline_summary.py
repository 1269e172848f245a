# Summarises per-CTA timelines (CSV from branch diag/timeline: start_ns,end_ns,smid,block).
# Usage: python3 2026-11-24_timeline_summary.py 2026-11-24_h100_fa649ac-diag_timeline_*.csv
import csv, sys, statistics as st
for path in sys.argv[1:]:
    cell = path
    rows=[(int(r['start_ns']),int(r['end_ns']),int(r['smid']),int(r['block'])) for r in csv.DictReader(open(path))]
    t0=min(r[0] for r in rows); t1=max(r[1] for r in rows)
    rows=[(a-t0,b-t0,s,k) for a,b,s,k in rows]
    starts=sorted(r[0] for r in rows); ends=sorted(r[1] for r in rows)
    dur=[b-a for a,b,_,_ in rows]
    n=len(rows)
    # wave 1: CTAs starting within 5 us of t0
    w1=[r for r in rows if r[0] < 5000]
    w2=[r for r in rows if r[0] >= 5000]
    print(f"== {cell}: {n} CTAs, span {(t1-t0)/1000:.1f} us; first-wave {len(w1)} CTAs start 0..{max(r[0] for r in w1)/1000:.2f} us")
    print(f"   duration us: min {min(dur)/1000:.1f} med {st.median(dur)/1000:.1f} max {max(dur)/1000:.1f}")
    if w1: print(f"   wave-1 ends: min {min(r[1] for r in w1)/1000:.1f} med {st.median([r[1] for r in w1])/1000:.1f} max {max(r[1] for r in w1)/1000:.1f}")
    if w2:
        print(f"   later starts: min {min(r[0] for r in w2)/1000:.1f} med {st.median([r[0] for r in w2])/1000:.1f} max {max(r[0] for r in w2)/1000:.1f}; their durations med {st.median([r[1]-r[0] for r in w2])/1000:.1f}")
        # gap between a CTA end and the next start on the same SM
        by_sm={}
        for r in rows: by_sm.setdefault(r[2],[]).append(r)
        gaps=[]
        for sm,rs in by_sm.items():
            es=sorted(r[1] for r in rs); ss=sorted(r[0] for r in rs if r[0]>=5000)
            for s_ in ss:
                prev=[e for e in es if e<=s_+200]
                if prev: gaps.append(s_-max(prev))
        if gaps: print(f"   end->next start on same SM (ns): med {st.median(gaps):.0f} max {max(gaps):.0f}")
    # active CTAs over time; time at which the count drops below thresholds
    ev=sorted([(a,1) for a,_,_,_ in rows]+[(b,-1) for _,b,_,_ in rows])
    act=0; below={}
    peak=0
    for t,d in ev:
        act+=d; peak=max(peak,act)
        for th in (264, 200,132,64,32):
            if act<th and t>10000 and th not in below: below[th]=t
    print("   peak active", peak, "; last drops below:", {k:f"{(t1-t0-v)/1000:.1f} us before end" for k,v in below.items()})
    print(f"   ends: 90% at {ends[int(0.9*n)]/1000:.1f}, 99% at {ends[int(0.99*n)-1]/1000:.1f}, last {ends[-1]/1000:.1f} us")
