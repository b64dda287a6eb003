"""The `aws` part: AWS Batch calls per tick of both managers against moto; and the moto helpers
(job queue, boto3 snippets) the `tiers` part uses too.
"""
import json
import os
import re
import subprocess
import time
import urllib.parse

from .common import ENV, PASSWORD, RUN_ID, USER
from .instruments import Proxy
from .managers import count_ticks, manager_argv, python_manager_env


def moto_batch(cfg, tmp, n, queue_env):
    """AWS calls per tick with n of the manager's jobs RUNNING in moto (hold mode)."""
    proxy = Proxy(int(urllib.parse.urlparse(ENV["AWS_ENDPOINT_URL"]).port or 5055))
    q = queue_env["CLW_MOTO_JOB_QUEUE_ARN"]
    definition = f"clwb-{RUN_ID}-{n}"
    boto(f"""
d = b.register_job_definition(jobDefinitionName={definition!r}, type='container',
    containerProperties={{'image': 'codalab/default-cpu:latest', 'vcpus': 1, 'memory': 128,
                          'command': ['true']}})
ids = [b.submit_job(jobName={definition!r} + '-' + '%016x' % i, jobQueue={q!r},
                    jobDefinition=d['jobDefinitionArn'])['jobId'] for i in range({n})]
print(json.dumps(ids))
""")
    # all RUNNING (hold mode steps through the states every 0.1 s)
    end = time.time() + 120
    while boto(f"""
n = 0
for p in b.get_paginator('list_jobs').paginate(jobQueue={q!r}, jobStatus='RUNNING'):
    n += len(p['jobSummaryList'])
print(n)""") < n:
        if time.time() > end:
            raise RuntimeError("moto jobs do not reach RUNNING")
        time.sleep(1)
    counts = {}
    tag = f"bench-aws-{RUN_ID}"
    try:
        for sysname in ("ours", "python"):
            work = os.path.join(tmp, f"aws-{sysname}-{n}")
            os.makedirs(work)
            env = dict(ENV, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD,
                       AWS_ENDPOINT_URL=proxy.url, AWS_ENDPOINT_URL_BATCH=proxy.url)
            if sysname == "python":
                env["PYTHONPATH"] = python_manager_env(tmp, aws=True)
            backend = ["aws-batch", "--job-queue", q, "--job-definition-name", definition,
                       "--cpus", "1", "--memory-mb", "1024", "--region", ENV.get("AWS_REGION", "us-east-1")]
            if sysname == "ours":
                backend += ["--worker-image", "codalab/worker:bench", "--password-secret-arn",
                            queue_env["CLW_MOTO_SECRET_ARN"], "--execution-role-arn",
                            queue_env["CLW_MOTO_EXECUTION_ROLE_ARN"]]
            # Ours counts a job as a running worker only once its worker checked in: with
            # --min-workers n the n placeholders are its floor, neither cancelled nor added to.
            g = ["--min-workers", str(n) if sysname == "ours" else "0", "--sleep-time", "3"]
            if sysname == "ours":
                g += ["--max-workers", str(n)]
            argv = manager_argv(sysname, cfg, tag, g, backend)
            t_start = time.time()
            calls = lambda: [(r["t"], r["method"] + " " + r["path"].split("?")[0])
                             for r in proxy.find("", after=t_start)]
            # Both in their loop; ticks 2-4 (the first holds the start-up checks and, for ours,
            # one DescribeJobs per 100 adopted jobs).
            counts[sysname] = count_ticks(argv, env, work, calls)
    finally:
        boto(f"""
for s in ('SUBMITTED', 'PENDING', 'RUNNABLE', 'STARTING', 'RUNNING'):
    for p in b.get_paginator('list_jobs').paginate(jobQueue={q!r}, jobStatus=s):
        for j in p['jobSummaryList']:
            b.terminate_job(jobId=j['jobId'], reason='bench done')
print(0)""")
    return counts


def moto_active(queue):
    return boto(f"""
n = 0
for s in ('SUBMITTED', 'PENDING', 'RUNNABLE', 'STARTING', 'RUNNING'):
    for p in b.get_paginator('list_jobs').paginate(jobQueue={queue!r}, jobStatus=s):
        n += len(p['jobSummaryList'])
print(n)""")


def moto_queue(root, name):
    """A job queue, compute environment and credentials secret of moto (tests/peers/moto.sh
    setup-batch): their names and ARNs, as CLW_MOTO_* keys."""
    return dict(re.findall(r"^export (\w+)=['\"]?([^'\"\n]*)", subprocess.run(
        ["bash", os.path.join(root, "tests/peers/moto.sh"), "setup-batch", name],
        env=dict(ENV, CLW_MOTO_CODALAB_PASSWORD=PASSWORD), check=True, capture_output=True,
        text=True).stdout, re.M))


def boto(code):
    script = "import boto3, json\nb = boto3.client('batch')\n" + code
    out = subprocess.run([ENV["CLW_MOTO_PYTHON"], "-c", script], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])
