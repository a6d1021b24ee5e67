/* `meshtrain generate` on any layout: the trainer's placement of a checkpoint's or a
 * safetensors file's model on the mesh, without a corpus, then generation on every rank. */
#include "trainer_internal.h"

mt_status mt_generate_run(const mt_config *cfg, mt_comm *world, const int32_t *prompt,
                          int prompt_length, const mt_generate_options *o)
{
    mt_config run;
    mt_ckpt_meta resume;
    trainer_init init;
    mt_run_plan plan;
    mt_status status = trainer_resolve_run(cfg, world, world ? mt_comm_size(world) : 1, &run, &resume, &init, &plan);
    if (status)
        return status;
    trainer tr = {.plan = &plan, .cfg = &plan.config, .state = {.world = world}};
    status = trainer_state_open_model(&tr, &plan, &resume, &init);
    mt_ckpt_meta_free(&resume);
    mt_safetensors_close(init.file);
    if (status == MT_OK) {
        mt_forward forward = tr.state.passes->forward(&tr);
        status = mt_generate(&forward, prompt, prompt_length, o);
    }
    trainer_state_close(&tr);
    mt_run_plan_free(&plan);
    return status;
}
