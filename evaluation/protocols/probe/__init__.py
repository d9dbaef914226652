"""The paper's section-7 mechanism probe: does demonstrated utility find the facts a correct answer used?"""
