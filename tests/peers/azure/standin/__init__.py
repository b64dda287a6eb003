"""The Azure Batch stand-in's code; ../batch_standin.py is its entry point (command
line, servers, signals) and its docstring says what it serves.

    common.py       helpers (log, times, ETags, loopback check), ApiError, constants
    odata.py        the OData $filter parser and evaluator of the list operations
    run_options.py  containerRunOptions: which `docker run` options pass, which are ignored
    service.py      Service: the state (jobs, pool, tasks, blobs, controls), JSON shapes,
                    scheduling, reset
    nodes.py        the pool's nodes: ids, states, faults, Remove Nodes, Spot eviction
    tasks.py        Task, and running one (docker run or a process), its end, output files
    batch_api.py    the Batch HTTP handler: plumbing, SharedKey/bearer auth, throttling,
                    routing, $select, paged listings
    pool_api.py     pool and node operations (get pool, list/get nodes, remove nodes)
    task_api.py     job and task operations (get job, add/list/get/terminate/delete task)
    control_api.py  the unauthenticated /_clw/ endpoints (state, requests, reset,
                    control, the nodes' instance metadata service)
    blob.py         the minimal Blob service for task output files
"""
