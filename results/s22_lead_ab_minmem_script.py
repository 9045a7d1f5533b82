import os, sys, time, json
os.environ["XLA_FLAGS"]="--xla_force_host_platform_device_count=8"
import shardgym as sg, zoo
import solvers.dispatch as D, solvers.minmem_bisect as MB
VAR={"s22c":dict(bs=0.45, sd=0.95), "oldbisect":dict(bs=0.7, sd=0.9)}
out=[]
for m in sys.argv[1].split(","):
    fn,args=zoo.build(m,"tiny",abstract=True,seed=0)
    g=sg.trace(fn,*args); p=sg.build_problem(g,sg.Cluster.preset("cpu-2x4"))
    mega=sg.solve(p,method="megatron"); T=1.05*sg.evaluate(p,mega).step_time_s
    for rep in range(2):
        for name in (["s22c","oldbisect"] if rep==0 else ["oldbisect","s22c"]):
            v=VAR[name]; D.BISECT_SHARE=MB.BISECT_SHARE=v["bs"]; MB.STEP_DOWN=v["sd"]
            t=time.time()
            pl=sg.solve(p,method="ilp",objective="memory",max_step_time_s=T,time_limit_s=60,initial_plans=[list(mega.strategies),[0]*p.num_nodes])
            c=sg.evaluate(p,pl); r=dict(model=m,variant=name,rep=rep,peak_MiB=c.peak_memory_bytes/2**20,step_vs_T=c.step_time_s/T,wall=time.time()-t,load=os.getloadavg()[0])
            print(r,flush=True); out.append(r)
json.dump(out,open("/tmp/ab_c.json","w"))
