"""Sample /proc every DT s; per process (pid,start) keep last cpu, cmdline, ppid. Dump JSON at SIGTERM/exit."""
import os, sys, time, json, signal
DT=float(sys.argv[2]) if len(sys.argv)>2 else 0.2
out=sys.argv[1]
tck=os.sysconf('SC_CLK_TCK')
procs={}
def scan():
    for d in os.listdir('/proc'):
        if not d.isdigit(): continue
        try:
            s=open(f'/proc/{d}/stat').read()
            r=s[s.rindex(')')+2:].split()
            ppid=int(r[1]); cpu=(int(r[11])+int(r[12]))/tck; start=r[19]
            key=f'{d}:{start}'
            p=procs.get(key)
            if p is None:
                try: cmd=open(f'/proc/{d}/cmdline','rb').read().replace(b'\0',b' ').decode(errors='replace')[:300]
                except Exception: cmd=''
                procs[key]={'pid':int(d),'ppid':ppid,'cmd':cmd,'cpu':cpu,'first':time.time()}
            else:
                p['cpu']=cpu; p['ppid']=ppid if p['ppid']==1 else p['ppid']
                p['last']=time.time()
        except Exception: pass
stop=False
def h(*a):
    global stop; stop=True
signal.signal(signal.SIGTERM,h); signal.signal(signal.SIGINT,h)
while not stop:
    scan(); time.sleep(DT)
json.dump(procs,open(out,'w'))
