// Every plugin the router runs, in order. A scorer's position decides nothing
// (costs add up); a filter's does. To add one: write its file, add a line here.
import { register } from "./framework";
import { usableFilter } from "./plugins/filter/usable";
import { rolePoolFilter } from "./plugins/filter/role-pool";
import { modelFilter } from "./plugins/filter/model";
import { prefixOverlapScorer } from "./plugins/scorer/prefix-overlap";
import { imageAffinityScorer } from "./plugins/scorer/image-affinity";
import { activeBlocksScorer } from "./plugins/scorer/active-blocks";
import { queuedPrefillScorer } from "./plugins/scorer/queued-prefill";
import { queuedSharedScorer } from "./plugins/scorer/queued-shared";
import { kvCapacityScorer } from "./plugins/scorer/kv-capacity";
import { lowestCostPicker } from "./plugins/picker/lowest-cost";
import { roundRobinPicker } from "./plugins/picker/round-robin";
import { randomPicker } from "./plugins/picker/random";
import { imageTouch, sessionBind } from "./plugins/lifecycle/remember";
import { loadReservation } from "./plugins/lifecycle/load";
import { speedLearning } from "./plugins/lifecycle/speed";

register.filter(usableFilter);
register.filter(rolePoolFilter);
register.filter(modelFilter);
register.scorer(prefixOverlapScorer);
register.scorer(imageAffinityScorer);
register.scorer(activeBlocksScorer);
register.scorer(queuedPrefillScorer);
register.scorer(queuedSharedScorer);
register.scorer(kvCapacityScorer);
register.picker(lowestCostPicker);
register.picker(roundRobinPicker);
register.picker(randomPicker);
register.lifecycle(imageTouch);
register.lifecycle(sessionBind);
register.lifecycle(loadReservation);
register.lifecycle(speedLearning);
