/* The Doorbell of src/base/doorbell.{h,cpp}: a futex word whose low bit says
   a waiter may sleep in the kernel unwoken, so that only the ring that finds
   the bit set makes a system call. tests/model/check_doorbell_model.sh runs
   it and its mutants.

   RINGERS threads each publish one piece of news and ring the bell, the
   first with ring() (the bells of arm()/park() waiters, the mailbox's), the
   others with ring_parked();
   WAITERS threads wait, as spin_then_park()'s park loop and the simulated
   AICPU loop do, through a Parking: counted, armed, one look at the
   condition (all the news is out), then Doorbell::wait(). A waiter may
   also return from the kernel without a ring (a deadline, a spurious
   return), at most TO times in all.

   Every load, store or read-modify-write of a shared word is one step,
   tagged `M:<name>`; the C++ cites the tag. The kernel's FUTEX_WAIT
   (compare the word, then sleep, as one step) and FUTEX_WAKE (wake every
   sleeper of the word) are one step each. Spin checks sequential
   consistency: the seq_cst fences of ring_parked() and Parking are what
   make the C++ behave so.

   Property: no lost wake-up. A waiter asleep in the kernel once every
   ringer has finished would sleep forever: an invalid end state. */

#ifndef WAITERS
#define WAITERS 2
#endif
#ifndef RINGERS
#define RINGERS 2
#endif
#ifndef TO
#define TO 1
#endif

#define ASLEEP 1

byte seq = 0;      /* the word: rings * 2, plus ASLEEP */
byte waiters = 0;  /* Parkings alive: what ring_parked() looks at */
byte news = 0;     /* the condition's state, written by the ringers */
bool sleeping[WAITERS];  /* in FUTEX_WAIT */
byte timeouts = 0;
#ifdef MUTANT_BIT_IN_ITS_OWN_WORD
bool asleep_flag = false;  /* the bit kept apart from the count */
#endif

proctype Ringer(bool parked) {
  byte old;
#ifdef MUTANT_LOOK_BEFORE_NEWS
  /* ring_parked() looks for waiters before its news is out */
  if
  :: parked && waiters == 0 -> news++; goto done
  :: else -> news++
  fi;
#else
  news++;                               /* the news, before the ring */
  if
  :: parked && waiters == 0 -> goto done   /* M:ring_parked_look: nobody counted */
  :: else
  fi;
#endif
#ifdef MUTANT_BIT_IN_ITS_OWN_WORD
  /* add, then exchange a flag of its own: it may clear the flag of a waiter
     that armed after this add, which then sleeps on a word no ring changes */
  seq = seq + 2;
  atomic { old = asleep_flag; asleep_flag = false };
  if
  :: old == 0 -> goto done
  :: else -> goto wake
  fi;
#endif
#ifdef MUTANT_BIT_LOOKED_AT_BEFORE_ADD
  /* the bit read by a load of its own, then the add */
  old = seq;
  seq = seq + 2;
#else
  atomic { old = seq; seq = seq + 2 }   /* M:ring_add: fetch_add(2) */
#endif
  if
  :: (old & ASLEEP) == 0 -> goto done   /* nobody went to sleep since the last wake */
  :: else
  fi;
  seq = seq & 254;                      /* M:ring_clear: fetch_and(~kAsleep) */
wake:
  atomic {                              /* M:ring_wake: FUTEX_WAKE, INT_MAX */
    byte i = 0;
    do
    :: i < WAITERS -> sleeping[i] = false; i++
    :: else -> break
    od
  }
done:
  skip
}

proctype Waiter(byte me) {
  byte armed, cur;
  do
  :: true ->
    waiters++;                          /* M:parking_count */
    armed = seq & 254;                  /* M:parking_arm */
    if
    :: news == RINGERS -> waiters--; break   /* the look at the condition */
    :: else
    fi;
#ifdef MUTANT_WAIT_FORGETS_ARMED
    /* the wait sleeps on whatever the word holds when it gets there */
    armed = seq & 254;
#endif
    cur = seq;                          /* M:wait_load */
retry:
    if
    :: (cur & 254) != armed -> goto unpark   /* rung since it armed */
    :: else
    fi;
    if
    :: (cur & ASLEEP) == 0 ->
#ifdef MUTANT_BIT_IN_ITS_OWN_WORD
      asleep_flag = true;
#elif defined(MUTANT_BIT_STORED)
      /* the bit set by a plain store of what was loaded */
      seq = cur | ASLEEP;
#else
      atomic {                          /* M:wait_mark: compare_exchange(cur, cur | kAsleep) */
        if
        :: seq == cur -> seq = cur | ASLEEP
        :: else -> cur = seq; goto retry
        fi
      }
#endif
    :: else
    fi;
    atomic {                            /* M:wait_sleep: FUTEX_WAIT on armed | kAsleep */
      if
#ifdef MUTANT_BIT_IN_ITS_OWN_WORD
      :: seq == armed -> sleeping[me] = true
#else
      :: seq == (armed | ASLEEP) -> sleeping[me] = true
#endif
      :: else
      fi
    }
    if
    :: !sleeping[me]
    :: timeouts < TO -> atomic { timeouts++; sleeping[me] = false }   /* a deadline or a spurious return */
    fi;
unpark:
    waiters--                           /* M:parking_end */
  od
}

init {
  atomic {
    byte i = 0;
    do
    :: i < WAITERS -> run Waiter(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < RINGERS -> run Ringer(i != 0); i++
    :: else -> break
    od
  }
}
