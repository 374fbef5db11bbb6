/* zt_model.c — being written */
