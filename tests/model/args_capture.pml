/* Mechanism R of seed 002 (issue 13, part 4): the per-task argument-capture
   rendezvous of the resident route, as the seed specifies it.
   tests/model/check_args_capture_model.sh runs it; docs/args_capture_protocol.md
   explains it.

   One ArgsCaptureSlot (claim, arrived_p, released_p, publisher_p, aborted),
   one request line and one ack line per core, one AICPU supervisor serving
   the lane. Three cores (bit 0 the AIC, bits 1 and 2 the AIVs) run TASKS mix
   tasks in turn on the slot, so the slot sees TASKS occupancies, each with a
   BEFORE and an AFTER phase. A task is dispatched only after its
   predecessor's completion is published (the slot is free only then).

   Every store or load of a shared word is its own step and carries a tag
   `M:<name>`; the C++ that implements it cites the tag (`// M:claim_cas`).
   Steps the seed makes one primitive (a CAS, a fetch_or, a device-direct
   store) are one step here. Words one writer stores together and no reader
   can observe in between are one step, with the reason beside them.

   Faults (at most TO in all): a waiter's budget expires while it waits in
   CLAIMING (ARGS_CAPTURE_INIT_LOST: it writes nothing and leaves into the
   fatal path) or in READY (ARGS_CAPTURE_TIMEOUT: CAS aborted 0 -> 1, keep
   polling). The AICPU may answer WouldBlock (arena back-pressure) up to WB
   times. The ack lines start with a previous run's Sealed acknowledgement
   (epoch PREV_EPOCH, task 1, phase_seq 1): what R102's test plants.

   Properties (assertions; a deadlock is an invalid end state):
   - one publisher per (occupancy, phase);
   - no participant executes before its task's BEFORE seal, and the AICPU
     copies BEFORE inputs only while no participant executes and AFTER
     outputs only after every participant finished and before the successor
     runs;
   - no completion before the AFTER seal; a participant leaves an aborted
     phase only on its Aborted ack, never on the flag;
   - no claim of the next occupancy before the last departure, and the claim
     clears nothing a participant already stored (no arrival bit lost);
   - no stale ack accepted: a terminal status a core accepts was written for
     this run, this occupancy and this phase;
   - an aborted occupancy never reaches SETTLED; with no fault every task
     completes;
   - under weak fairness every core finishes (ltl every_core_leaves).

   A second gate is modelled by its effect on one ack line only (R104): core
   0, having published an AFTER phase, moves on once to an independent
   single task on another gate, whose first request rewrites core 0's ack
   line while a peer may still have to read the seal there. It waits until
   every participant of that phase left (M:reuse_wait).

   Not modelled: the payload bytes and the lane's metadata buffer (one open
   reservation per lane, R108, is a property test of the producer); other
   slots beyond that request, and other lanes (so the lane is never busy; WouldBlock stands for every back-pressure cause); an AICPU that
   never acknowledges (the model's AICPU always answers a published request;
   the second, longer budget is taken only where no request can ever exist). */

#ifndef TASKS
#define TASKS 2
#endif
#ifndef TO
#define TO 1
#endif
#ifndef WB
#define WB 1
#endif
#ifndef CHUNKS
#define CHUNKS 2   /* requests per phase: InProgress, then Sealed */
#endif

#define NCORE 3
#define MASK 7     /* active_mask of a 1C2V mix task */
#define BEFORE 0
#define AFTER 1

/* claim = (state << 62) | occupancy: one word, so (cst, cocc) change together */
#define FREE 0
#define CLAIMING 1
#define READY 2
#define SETTLED 3

/* ack status */
#define WOULDBLOCK 1
#define INPROGRESS 2
#define SEALED 3
#define ABORTED 4
#define TERMINAL(s) ((s) == SEALED || (s) == ABORTED)

/* run_epoch. The fourth revision packed a 30-bit epoch into the gate word: at
   model scale, a 2-bit field, so the previous run's epoch aliases this one's. */
#define EPOCH 5
#define PREV_EPOCH 1
#ifdef MUTANT_TRUNCATED_IDENTITY
#define EP(e) ((e) & 3)
#else
#define EP(e) (e)
#endif
#define IDMATCH(c, task, seq) (EP(ak_ep[c]) == EP(EPOCH) && ak_task[c] == (task) && ak_seq[c] == (seq))
#ifdef MUTANT_PEER_IGNORES_PHASE_SEQ
#define PEER_IDMATCH(c, task, seq) (EP(ak_ep[c]) == EP(EPOCH) && ak_task[c] == (task))
#else
#define PEER_IDMATCH(c, task, seq) IDMATCH(c, task, seq)
#endif

#ifdef MUTANT_SETTLE_ON_SEAL
#define SETTLER last               /* the publisher settles on the seal */
#else
#define SETTLER ((r | mybit) == MASK) /* the release that completes released_after */
#endif
#define OBSERVE t = rq_tick[c]; rn = rq_task[c]; rp = rq_phase[c]; rs = rq_seq[c]; rc = rq_cur[c]
#define PH(n, p) ((n) * 2 + (p))   /* index of (occupancy, phase) */
#define SINGLE (TASKS + 1)         /* core 0's single task on the second gate */
#define NPH ((TASKS + 2) * 2)

/* ---- the slot: ArgsCaptureSlot ---- */
byte cst; byte cocc;               /* claim */
byte arr[2]; byte rel[2];          /* arrived_p, released_p */
byte pubc[2]; byte pubs[2];        /* publisher_p = (core + 1) << 32 | phase_seq */
bool aborted;

/* ---- request lines (the core writes, the AICPU reads) ---- */
byte rq_task[NCORE]; byte rq_phase[NCORE]; byte rq_seq[NCORE]; byte rq_cur[NCORE]; byte rq_tick[NCORE];

/* ---- ack lines (the AICPU writes; the publisher and its peers read) ---- */
byte ak_st[NCORE] = SEALED; byte ak_cur[NCORE]; byte ak_tick[NCORE];
byte ak_ep[NCORE] = PREV_EPOCH; byte ak_task[NCORE] = 1; byte ak_seq[NCORE] = 1;

/* ---- the run ---- */
bool task_done[TASKS + 1];         /* the task's completion, published by its settler */
bool fatal;                        /* the run's error latch */

/* ---- ghosts: read by assertions and by the fault guards only ---- */
/* what the ack status word currently answers: run (1 = this one), occupancy, phase */
byte g_run[NCORE]; byte g_n[NCORE]; byte g_p[NCORE];
byte npub[NPH];                    /* publishers per (occupancy, phase) */
bool sealed[NPH]; bool abort_acked[NPH];
bool unarrivable[NPH];             /* a participant left before arriving: never published */
byte joined[TASKS + 1];            /* participants that stored an arrival bit */
byte arrived_g[NPH]; byte released_g[NPH];  /* the bits each mask must hold */
byte departed[TASKS + 1];          /* participants whose released_after bit is stored */
byte exec_started[TASKS + 2]; byte exec_done[TASKS + 2];
bool single_sent;                  /* core 0 published its single task's first request */
byte to_used; byte ended; bool done;

inline fault_left(n, from) {
  /* the phases this core will never arrive at can never be published */
  for (q : from .. 1) { unarrivable[PH(n, q)] = true };
  q = 0
}

/* the task's completion: its successors may now be dispatched */
inline complete_task(n) {
  atomic { assert(sealed[PH(n, AFTER)]);  /* no completion before the AFTER seal */
           task_done[n] = true }                                         /* M:complete */
}

proctype Core(byte me) {
  byte k = 1, n, p, ost, oocc, r, pc, ps, st, gs, gn, gp, seqctr, seq, tick, cur, q;
  bool published_after;              /* it published the AFTER phase it just left */
  bool won, last, stored, i_aborted;
  byte mybit = 1 << me;
#ifdef MUTANT_ABORT_WRITES_LINE_BACK
  byte s_arr0, s_arr1, s_rel0, s_rel1, s_pc0, s_ps0, s_pc1, s_ps1;
#endif

next_task:
  if
  :: k > TASKS -> goto finished
  :: k <= TASKS && (k == 1 || task_done[k - 1])  /* dispatched after its predecessor completed */
  :: atomic { k <= TASKS && fatal -> fault_left(k, BEFORE) }; goto gone  /* the fatal path takes no further task */
  fi;

  /* step 1: claim, only from a state that proves nobody is inside */
claim:
  atomic { ost = cst; oocc = cocc }                                      /* M:claim_load */
  if
  :: ost == FREE || ost == SETTLED ->
     atomic {                                                            /* M:claim_cas */
       if
       :: cst == ost && cocc == oocc ->
          /* no claim of the next occupancy before the last departure */
          assert(oocc == 0 || departed[oocc] == MASK);
          n = oocc + 1;
#ifdef MUTANT_SINGLE_CAS_CLAIM
          cst = READY;                 /* identity published in the CAS; the clear follows */
#else
          cst = CLAIMING;
#endif
          cocc = n; won = true
       :: else -> won = false
       fi;
       ost = 0; oocc = 0 }
     if :: won -> goto initialize :: else -> goto claim fi
  :: ost == CLAIMING || ost == READY -> n = oocc; ost = 0; oocc = 0;
#ifdef MUTANT_LATE_CLAIMER
     /* the fourth revision: CLAIMING is a source state, expected == desired */
     atomic { if :: cst == CLAIMING && cocc == n -> won = true :: else -> won = false fi }
     if :: won -> goto initialize :: else fi;
#endif
     goto wait_ready
  fi;

  /* step 2: inside CLAIMING the claimer is the only writer, of words no peer
     reads before READY, so the clear is one step */
initialize:
  atomic {                                                               /* M:init_clear */
    assert(joined[n] == 0);          /* the clear races nothing: no arrival bit lost */
    arr[0] = 0; arr[1] = 0; rel[0] = 0; rel[1] = 0;
    pubc[0] = 0; pubs[0] = 0; pubc[1] = 0; pubs[1] = 0; aborted = false; won = false }
#ifdef MUTANT_SINGLE_CAS_CLAIM
  goto join;
#else
  atomic { cst = READY; cocc = n }                                       /* M:ready_store */
  goto join;
#endif

  /* step 4: a joiner waits for READY of the occupancy it joined */
wait_ready:
  if
  :: atomic { cst == READY && cocc == n -> skip }                        /* M:join_load */
  :: atomic { cocc != n -> fatal = true; fault_left(n, BEFORE) }; goto gone  /* M:join_foreign */
  :: atomic { cst == CLAIMING && cocc == n && to_used < TO ->            /* M:init_lost */
       to_used++; fatal = true; fault_left(n, BEFORE) }; goto gone
  fi;

join:
  atomic {                                                               /* M:arrive_fetch_or */
    assert(n == k);                  /* a core joins its own task's occupancy */
    if :: p == AFTER -> exec_done[n] = exec_done[n] | mybit :: else fi;  /* its outputs are written */
    r = arr[p]; arr[p] = r | mybit; joined[n] = joined[n] | mybit;
    assert((r & arrived_g[PH(n, p)]) == arrived_g[PH(n, p)]);  /* no arrival bit lost */
    arrived_g[PH(n, p)] = arrived_g[PH(n, p)] | mybit;
#if defined(MUTANT_FIRST_REQUESTER_WINS)
    last = (r == 0)
#elif defined(MUTANT_AFTER_FIRST_ARRIVER_PUBLISHES)
    last = (p == AFTER -> r == 0 : (r | mybit) == MASK)
#else
    last = ((r | mybit) == MASK)
#endif
  }
#ifdef MUTANT_ABORT_WRITES_LINE_BACK
  /* the line as this core's cache last held it */
  atomic { s_arr0 = arr[0]; s_arr1 = arr[1]; s_rel0 = rel[0]; s_rel1 = rel[1];
           s_pc0 = pubc[0]; s_ps0 = pubs[0]; s_pc1 = pubc[1]; s_ps1 = pubs[1] }
#endif
#ifdef MUTANT_LAST_ARRIVER_BY_RELOAD
  atomic { last = (arr[p] == MASK) }  /* a second load decides, not the fetch_or's result */
#endif
  if :: last -> goto publish :: else -> goto follow fi;

  /* step 5: the last arriver allocates the phase's one identity and writes
     its own request line (no other writer; the AICPU reads it after the tick) */
publish:
  atomic { seqctr++; seq = seqctr; cur = 0 }
republish:
  atomic {                                                               /* M:req_fields */
    tick++;
#ifdef MUTANT_PHASE_SEQ_IS_TICK
    seq = tick;                      /* the phase's identity advances with each request */
#endif
    rq_task[me] = n; rq_phase[me] = p; rq_cur[me] = cur; rq_seq[me] = seq }
  rq_tick[me] = tick;                                                    /* M:req_tick */
#ifdef MUTANT_COMPLETE_BEFORE_SEAL
  if :: p == AFTER && !stored -> complete_task(n) :: else fi;  /* completion with the request */
#endif
  if
  :: !stored ->                      /* once per phase, after its first request */
     atomic {                                                            /* M:publisher_store */
       assert(npub[PH(n, p)] == 0);  /* one publisher per (occupancy, phase) */
       assert(!unarrivable[PH(n, p)]);  /* the second budget's premise: it never cuts a request short */
       npub[PH(n, p)]++; pubc[p] = me + 1; pubs[p] = seq; stored = true }
  :: else
  fi;

  /* step 7: the publisher matches identity, then its own request_tick (the
     reverse of the AICPU's write order), then reads status and cursor */
pub_wait:
  if
  :: atomic { IDMATCH(me, n, seq) && ak_tick[me] == tick ->               /* M:pub_read_ack */
       st = ak_st[me]; gs = g_run[me]; gn = g_n[me]; gp = g_p[me]; cur = ak_cur[me] }
     if
     :: TERMINAL(st) -> goto accept
     :: else -> atomic { st = 0; gs = 0; gn = 0; gp = 0 }; goto republish
     fi
  :: atomic { !i_aborted && to_used < TO -> to_used++; i_aborted = true; fatal = true }
     goto abort_cas
  fi;

#if defined(MUTANT_FIRST_REQUESTER_WINS)
follow:                              /* the first version: only the requester waits */
  atomic { st = SEALED; goto leave_sealed }
#else
#ifdef MUTANT_AFTER_FIRST_ARRIVER_PUBLISHES
follow:                              /* AFTER: one arrival is taken as the phase's */
  if :: p == AFTER -> atomic { st = SEALED; goto leave_sealed } :: else fi;
#else
follow:
#endif
  /* step 6: a peer follows the phase's publisher word */
  if
  :: atomic { pubc[p] != 0 -> pc = pubc[p] - 1; ps = pubs[p] }           /* M:follow_publisher */
  :: atomic { !i_aborted && to_used < TO -> to_used++; i_aborted = true; fatal = true }
     goto abort_cas
  :: atomic { fatal && unarrivable[PH(n, p)] ->                          /* M:second_budget */
       fault_left(n, p + 1) }; goto gone
#ifdef MUTANT_LEAVE_ON_ABORT_FLAG
  :: aborted -> goto leave_aborted
#endif
  fi;
#endif

  /* a peer accepts identity plus a terminal status and reads nothing else:
     identity first, then status (the reverse of the AICPU's write order) */
peer_poll:
  if
#ifdef MUTANT_PEER_READS_STATUS_FIRST
  :: atomic { st = ak_st[pc]; gs = g_run[pc]; gn = g_n[pc]; gp = g_p[pc] }
     if
     :: PEER_IDMATCH(pc, n, ps) && TERMINAL(st) -> goto accept
     :: else -> goto peer_poll
     fi
#else
  /* a re-read of an unchanged status is a stutter: wait for it to change */
  :: atomic { PEER_IDMATCH(pc, n, ps) && (st == 0 || ak_st[pc] != st) -> skip }  /* M:peer_read_identity */
     atomic {                                                            /* M:peer_read_status */
       st = ak_st[pc]; gs = g_run[pc]; gn = g_n[pc]; gp = g_p[pc];
       if :: TERMINAL(st) -> goto accept :: else fi }
     goto peer_poll
#endif
  :: atomic { !i_aborted && to_used < TO -> to_used++; i_aborted = true; fatal = true }
     goto abort_cas
#ifdef MUTANT_LEAVE_ON_ABORT_FLAG
  :: aborted -> goto leave_aborted
#endif
  fi;

  /* row 11: the first waiter to time out publishes the abort with the CAS
     alone, and keeps polling */
abort_cas:
  atomic { if :: !aborted -> aborted = true :: else fi }                 /* M:abort_cas */
#ifdef MUTANT_ABORT_WRITES_LINE_BACK
  atomic { arr[0] = s_arr0; arr[1] = s_arr1; rel[0] = s_rel0; rel[1] = s_rel1;
           pubc[0] = s_pc0; pubs[0] = s_ps0; pubc[1] = s_pc1; pubs[1] = s_ps1 }
#endif
  if
  :: last -> goto pub_wait
  :: !last && ps == 0 -> goto follow                /* publisher word not read yet */
  :: else -> goto peer_poll
  fi;

accept:
  atomic {
    /* no stale ack accepted: the status answers this run, occupancy and phase */
    assert(gs == 1 && gn == n && gp == p);
    gs = 0; gn = 0; gp = 0;
    if
    :: st == SEALED && !i_aborted -> goto leave_sealed
    :: else -> goto leave_aborted
    fi }

leave_aborted:
  atomic {
    /* a participant leaves an aborted phase only on the Aborted ack; a core
       that timed out leaves into the fatal path even on a seal */
    assert(abort_acked[PH(n, p)] || (i_aborted && sealed[PH(n, p)]));
    fatal = true; fault_left(n, p + 1);
    goto gone }

  /* step 8: leave, then execute (BEFORE) or settle and complete (AFTER) */
leave_sealed:
  atomic {                                                               /* M:release_fetch_or */
    r = rel[p]; rel[p] = r | mybit;
    assert((r & released_g[PH(n, p)]) == released_g[PH(n, p)]);  /* no departure bit lost */
    released_g[PH(n, p)] = released_g[PH(n, p)] | mybit;
    if
    :: p == BEFORE ->                                                    /* M:execute */
       assert(sealed[PH(n, BEFORE)]);  /* no execute before the BEFORE seal */
       exec_started[n] = exec_started[n] | mybit;
       p = AFTER; pc = 0; ps = 0; st = 0; r = 0; last = false; stored = false;
       goto join
    :: p == AFTER -> departed[n] = departed[n] | mybit
    fi }
  if
  :: SETTLER ->
     atomic { assert(!aborted);       /* an aborted occupancy never settles */
              cst = SETTLED; cocc = n }                                  /* M:settle_store */
#ifndef MUTANT_COMPLETE_BEFORE_SEAL
     complete_task(n)
#endif
  :: else
  fi;
  /* R104: core 0 moves on to its single task on another gate. Its first
     request there makes the AICPU rewrite core 0's ack line, so it waits
     until every participant of the AFTER phase it published has left: the
     gate settled or was claimed again. The run failing first: no request. */
  published_after = last;
  if
  :: me == 0 && published_after && !single_sent ->
     if
#ifdef MUTANT_REUSE_BEFORE_DEPARTURE
     :: true ->
#else
     :: atomic { cocc != n || rel[AFTER] == MASK -> skip }               /* M:reuse_wait */
#endif
        atomic { seqctr++; tick++; rq_task[me] = SINGLE; rq_phase[me] = BEFORE; rq_cur[me] = 0;
                 rq_seq[me] = seqctr; single_sent = true }
        rq_tick[me] = tick
     :: fatal -> skip
     fi
  :: else
  fi;
  atomic { published_after = false; k++; n = 0; p = BEFORE; r = 0; pc = 0; ps = 0; st = 0; cur = 0; last = false; stored = false;
           seq = 0; goto next_task }

gone:
finished:
  atomic { ended++; if :: ended == NCORE -> done = true :: else fi }
}

/* The supervisor serving the lane: first observation of a request (a new
   request_tick), then one service step answered on the core's ack line:
   progress words first, then the identity last. */
active proctype Aicpu() {
  byte c, t, rn, rp, rs, rc, wb, q;
end_serve:
  /* first observation of a request: a request_tick it has not answered. The
     tick is written last after a barrier: read it, then the fields. */
  do
  :: atomic { rq_tick[0] != ak_tick[0] -> c = 0; OBSERVE } break         /* M:svc_observe */
  :: atomic { rq_tick[1] != ak_tick[1] -> c = 1; OBSERVE } break
  :: atomic { rq_tick[2] != ak_tick[2] -> c = 2; OBSERVE } break
  :: done -> goto stopped
  od;
  if
  :: aborted ->                                                          /* M:svc_abort */
     q = ABORTED   /* the chunk in flight is finished; an open reservation abandoned */
#ifdef MUTANT_WOULDBLOCK_FOREVER
  :: !aborted -> q = WOULDBLOCK      /* the arena never drains (liveness mutant) */
#else
  :: !aborted && wb < WB -> wb++; q = WOULDBLOCK  /* arena predicate, no buffer: nothing reserved */
#endif
  :: !aborted ->
     atomic {                                                            /* M:svc_copy_chunk */
       if
       :: rp == BEFORE -> assert(exec_started[rn] == 0)  /* the inputs the task reads */
       :: rp == AFTER -> assert(exec_done[rn] == MASK && (rn >= TASKS || exec_started[rn + 1] == 0))
       fi;
       rc++;
       if :: rc == CHUNKS -> q = SEALED :: else -> q = INPROGRESS fi }  /* commit on the last */
  fi;
  /* status, cursor and the echoed tick (tick after status: the publisher
     reads tick, then status); a terminal status is the seal or the abort ack */
  atomic { ak_st[c] = q; ak_cur[c] = rc; ak_tick[c] = t;                 /* M:ack_progress */
           g_run[c] = 1; g_n[c] = rn; g_p[c] = rp;
           if :: q == SEALED -> sealed[PH(rn, rp)] = true
              :: q == ABORTED -> abort_acked[PH(rn, rp)] = true
              :: else fi }
  atomic { ak_ep[c] = EPOCH; ak_task[c] = rn; ak_seq[c] = rs;            /* M:ack_identity */
           c = 0; t = 0; rn = 0; rp = 0; rs = 0; rc = 0; q = 0 }
  goto end_serve;
stopped:
  skip
}

init {
  atomic {
    run Core(0); run Core(1); run Core(2)
  }
  done;
  /* with no fault every task completes; an aborted run completes nothing more */
  assert(fatal || task_done[TASKS]);
  assert(to_used > 0 || !fatal)
}

ltl every_core_leaves { <> done }
